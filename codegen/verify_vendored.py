#!/usr/bin/env python3
"""Verify vendored contractgen files with nothing but the standard library (a pre-commit hook).

    python3 verify_vendored.py FILE...

Groups the files by folder and runs that folder's own generated ``schema.py --verify`` on them:
exit 1 if any was edited by hand (its body no longer matches the sha256 in its header) or the
contract data no longer matches its fingerprints; exit 0 otherwise. Needs no install, so a
sibling repo's hook runs it without contractgen (``.pre-commit-hooks.yaml``,
``contractgen-verify-vendored``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    folders: dict[Path, list[str]] = {}
    for name in argv:
        path = Path(name)
        folders.setdefault(path.parent, []).append(path.name)
    status = 0
    for folder, names in sorted(folders.items()):
        schema = folder / "schema.py"
        if not schema.is_file():
            print(f"{folder}: no generated schema.py beside {', '.join(names)}", file=sys.stderr)
            status = 1
            continue
        done = subprocess.run(
            [sys.executable, "-S", "schema.py", "--verify", *sorted(set(names))], cwd=folder
        )
        status = max(status, done.returncode)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
