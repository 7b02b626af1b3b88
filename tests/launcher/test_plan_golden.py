"""Golden files for ``contractgen plan`` in every format (sqlc's testdata/ shape).

``golden/<case>/args.txt`` holds the command line (``env.json`` the environment it inherits, and
``contractgen.toml`` the project config, if not contractgen's own);
the expected outputs beside it are ``plan.txt``, ``plan.json``, ``plan.sh`` and ``stderr.txt`` for
a valid layout, ``stderr.txt`` and ``exit_code.txt`` for a refused one. Fingerprints are written
as ``sha256:<fingerprint>`` so a contract edit that renders the same launch changes no golden.
Refresh: ``UPDATE_GOLDENS=1 .venv/bin/python -m pytest tests/launcher``.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from contractgen.cli import main

GOLDEN = Path(__file__).parent / "golden"
CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"
CASES = sorted(p.name for p in GOLDEN.iterdir() if p.is_dir())
UPDATE = os.environ.get("UPDATE_GOLDENS") == "1"
REFRESH = "UPDATE_GOLDENS=1 .venv/bin/python -m pytest tests/launcher"
FORMATS = {"text": "plan.txt", "json": "plan.json", "shell": "plan.sh"}
FINGERPRINT = re.compile(r"sha256:[0-9a-f]{12,64}")


def _normalise(text: str) -> str:
    return FINGERPRINT.sub("sha256:<fingerprint>", text)


def _root(case: Path) -> list[str]:
    """``--root`` of a project with the shipped contracts and the case's ``contractgen.toml``
    (a case without one runs contractgen's own config: every target implements dense v1 only)."""
    config = case / "contractgen.toml"
    if not config.is_file():
        return []
    root = Path(tempfile.mkdtemp(prefix=f"plan-golden-{case.name}-"))
    shutil.copytree(CONTRACTS, root / "contracts")
    shutil.copy(config, root / "contractgen.toml")
    return ["--root", str(root)]


def _run(case: Path, fmt: str) -> tuple[int, str, str]:
    env = (
        {"NCCL_ALGO": None, **json.loads((case / "env.json").read_text())}
        if (case / "env.json").is_file()
        else {"NCCL_ALGO": None}
    )
    args = [*shlex.split((case / "args.txt").read_text()), "--format", fmt]
    root = _root(case)
    try:
        result = CliRunner().invoke(main, [*root, "plan", *args], env=env)
    finally:
        if root:
            shutil.rmtree(root[1], ignore_errors=True)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, _normalise(result.stdout), _normalise(result.stderr)


def _check(path: Path, actual: str) -> None:
    if UPDATE:
        path.write_text(actual)
        return
    expected = path.read_text() if path.is_file() else ""
    if expected != actual:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                f"{path.parent.name}/{path.name} (golden)",
                "(actual)",
            )
        )
        pytest.fail(f"{diff}\nIf the change is intended, refresh the goldens with:\n    {REFRESH}")


@pytest.mark.parametrize("case", CASES)
def test_plan_golden(case: str) -> None:
    folder = GOLDEN / case
    if case.startswith("error_"):
        code, out, err = _run(folder, "text")
        assert out == ""
        _check(folder / "stderr.txt", err)
        _check(folder / "exit_code.txt", f"{code}\n")
        for fmt in ("json", "shell"):  # a refusal does not depend on the format
            assert _run(folder, fmt) == (code, "", err)
        return
    for fmt, name in FORMATS.items():
        code, out, err = _run(folder, fmt)
        assert code == 0, err
        _check(folder / name, out)
        _check(folder / "stderr.txt", err)


def test_json_golden_is_json() -> None:
    for case in CASES:
        path = GOLDEN / case / "plan.json"
        if path.is_file():
            data = json.loads(path.read_text())
            assert data["commands"]["rollout"][:3] == ["python", "-m", "sglang.launch_server"]


def test_shell_golden_is_shell(tmp_path: Path) -> None:
    """The shell format is what `bash -n` accepts: exports, then miles' one command (SGLang
    alone is a comment: miles starts the engines)."""
    import subprocess

    for case in CASES:
        path = GOLDEN / case / "plan.sh"
        if not path.is_file():
            continue
        subprocess.run(["bash", "-n", str(path)], check=True)
        lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
        assert all(line.startswith("export ") for line in lines[:-1])
        assert lines[-1].startswith("python train.py ")
        assert "# SGLang alone (outside miles): python -m sglang.launch_server " in path.read_text()
