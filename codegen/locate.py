"""Find the true-on-policy packages a sibling repo already keeps (wherever they are).

``sync`` and ``adopt`` write only at the package path of ``contractgen.toml``; when nothing is
there but the repo keeps its package elsewhere (the public Megatron-LM fork's
``miles_megatron_plugins/true_on_policy``), they refuse and print the config line to add instead
of creating a second, unused package.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_NAME = "true_on_policy"
MARKERS = ("schema.py", "contracts.py")  # what every public copy of the package holds
_SKIP = {".git", ".hg", ".venv", "venv", "node_modules", "build", "dist", "__pycache__",
         "site-packages", ".tox", ".mypy_cache", ".ruff_cache", ".pytest_cache"}  # fmt: skip
MAX_DEPTH = 6


def find_packages(repo: Path) -> list[str]:
    """Relative POSIX paths of ``…/true_on_policy`` folders holding a schema.py or contracts.py
    (tests and examples left out), shortest first."""
    found: list[str] = []
    root = repo.resolve()
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        rel = here.relative_to(root)
        dirs[:] = sorted(
            d for d in dirs
            if d not in _SKIP and not d.startswith(".") and len(rel.parts) < MAX_DEPTH
        )  # fmt: skip
        if rel.parts and rel.parts[0] in ("tests", "test", "examples", "docs"):
            dirs[:] = []
            continue
        if here.name == PACKAGE_NAME and any(m in files for m in MARKERS):
            found.append(rel.as_posix())
    return sorted(found, key=lambda p: (p.count("/"), p))


def config_lines(target: str, package: str, contracts: tuple[str, ...] | None = None) -> str:
    """The ``contractgen.toml`` lines that point ``target`` at ``package``."""
    lines = [f"[targets.{target}]", f'package = "{package}"']
    if contracts:
        lines.append("contracts = [" + ", ".join(f'"{c}"' for c in contracts) + "]")
    return "\n".join(lines)


def misplaced(repo: Path, target: str, package: str) -> str:
    """Why writing ``package`` into ``repo`` would be a write elsewhere ('' when it is fine):
    the configured folder does not exist but the repo keeps its package at another path."""
    if (repo / package).is_dir():
        return ""
    others = [p for p in find_packages(repo) if p != package]
    if not others:
        return ""
    return (
        f"{repo}: no {package}/ here, but the repo keeps its true-on-policy package in "
        f"{others[0]}/; refusing to write a second, unused package. Point contractgen at it "
        f"(contractgen.toml):\n{config_lines(target, others[0])}"
    )
