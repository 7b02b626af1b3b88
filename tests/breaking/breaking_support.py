"""Shared by the breaking/new tests: temporary git projects, the CLI, golden files.

A project is ``fixture/`` (a frozen copy of the contracts and contractgen.toml, so golden line
numbers do not move when the real contracts are edited) plus its rendered ``generated/``, committed
to a fresh git repository on branch ``main``.
"""

from __future__ import annotations

import atexit
import difflib
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from click.testing import CliRunner

from contractgen.cli import main
from contractgen.codegen.config import load_config
from contractgen.codegen.render import render
from contractgen.schema.loader import load_contracts

HERE = Path(__file__).parent
FIXTURE = HERE / "fixture"
V1 = "contracts/qwen3_dense_true_on_policy_v1.yaml"
V2 = "contracts/qwen3_dense_true_on_policy_v2.yaml"
REFRESH = "UPDATE_GOLDENS=1 .venv/bin/python -m pytest tests/breaking"
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


def git(root: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-c", "commit.gpgsign=false", *args],
        cwd=root,
        env={**os.environ, **_GIT_ENV},
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout


def commit(root: Path, message: str) -> None:
    git(root, "add", "-A", ".")
    git(root, "commit", "-q", "--allow-empty", "-m", message)


def copy_fixture(dest: Path) -> Path:
    shutil.copytree(FIXTURE, dest)
    return dest


def generate(root: Path) -> None:
    """Write what ``render()`` gives into generated/ (what `contractgen generate` does)."""
    config = load_config(root)
    gen = config.generated_dir
    if gen.exists():
        shutil.rmtree(gen)
    for rel, content in render(load_contracts(config.contracts_dir, root), config).items():
        path = gen / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


@functools.cache
def _base_repo() -> Path:
    """Built once per test session (render and git init are the slow part), then copied."""
    tmp = Path(tempfile.mkdtemp(prefix="contractgen-breaking-base-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    repo = copy_fixture(tmp / "repo")
    generate(repo)
    git(repo, "-c", "init.defaultBranch=main", "init", "-q")
    commit(repo, "base")
    return repo


def make_repo(dest: Path) -> Path:
    """A git repo on ``main`` with the fixture contracts and their generated files, committed."""
    shutil.copytree(_base_repo(), dest, symlinks=True)
    return dest


def replace(root: Path, file: str, old: str, new: str) -> None:
    """Replace the one occurrence of ``old`` in ``root/file``; fail loudly if it is not unique."""
    path = root / file
    text = path.read_text()
    assert text.count(old) == 1, f"{file}: {old!r} occurs {text.count(old)} times"
    path.write_text(text.replace(old, new))


def cli(root: Path, *args: str) -> tuple[int, str, str]:
    """Run contractgen in-process on the project at ``root``: (exit code, stdout, stderr)."""
    result = CliRunner().invoke(main, ["--root", str(root), *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def transcript(root: Path, args: list[str]) -> str:
    """The run as one golden text: command, exit code, stdout, stderr; tmp paths as <root>."""
    code, out, err = cli(root, *args)
    text = f"$ contractgen {' '.join(args)}\nexit {code}\n--- stdout\n{out}--- stderr\n{err}"
    return text.replace(str(root.resolve()), "<root>").replace(str(root), "<root>")


def check_golden(path: Path, actual: str) -> None:
    """Compare with a golden file; UPDATE_GOLDENS=1 rewrites it instead."""
    if os.environ.get("UPDATE_GOLDENS") == "1":
        path.write_text(actual)
        return
    expected = path.read_text() if path.exists() else ""
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                f"{path} (golden)",
                f"{path} (actual)",
            )
        )
        raise AssertionError(f"{path.name} differs from its golden:\n{diff}\nrefresh: {REFRESH}")
