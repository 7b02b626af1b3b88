"""Golden-file case folders (sqlc's testdata/ shape).

``golden/generate/<case>/``: ``contracts/`` (+ optional ``contractgen.toml``) in, ``expected/`` out:
every file ``render()`` produces, byte for byte.
``golden/errors/<case>/``: ``contracts/`` in, ``stderr.txt`` out: ``contractgen generate`` exits 2
with one ``file:line:col: field.path: message`` line per problem and writes nothing.

On a mismatch the test prints the diff and the one command that refreshes the goldens.
"""

from __future__ import annotations

import difflib
import re
import shutil
from pathlib import Path

import pytest

from .helpers import GOLDEN, REFRESH, UPDATE_GOLDENS, cli_process, files_under

GENERATE_CASES = sorted(p.name for p in (GOLDEN / "generate").iterdir() if p.is_dir())
ERROR_CASES = sorted(p.name for p in (GOLDEN / "errors").iterdir() if p.is_dir())
PROBLEM_LINE = re.compile(r"^contracts/[a-z0-9_]+\.yaml:\d+:\d+: ([a-z0-9_.]+: )?\S.*$")


def _diff(expected: bytes, actual: bytes, name: str) -> str:
    lines = difflib.unified_diff(
        expected.decode("utf-8", "replace").splitlines(keepends=True),
        actual.decode("utf-8", "replace").splitlines(keepends=True),
        f"{name} (golden)",
        f"{name} (actual)",
    )
    return "".join(lines)


def _mismatch(case: str, diffs: list[str]) -> str:
    return (
        f"golden case {case!r} differs:\n"
        + "\n".join(diffs)
        + f"\nIf the change is intended, refresh the goldens with:\n    {REFRESH}\n"
    )


def _compare_tree(case: str, expected_dir: Path, actual: dict[str, bytes]) -> None:
    if UPDATE_GOLDENS:
        shutil.rmtree(expected_dir, ignore_errors=True)
        for rel, content in actual.items():
            (expected_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (expected_dir / rel).write_bytes(content)
        return
    expected = files_under(expected_dir) if expected_dir.is_dir() else {}
    diffs = []
    for rel in sorted(set(expected) | set(actual)):
        if rel not in actual:
            diffs.append(f"missing from the output: {rel}")
        elif rel not in expected:
            diffs.append(f"not in the goldens: {rel}\n" + _diff(b"", actual[rel], rel))
        elif expected[rel] != actual[rel]:
            diffs.append(_diff(expected[rel], actual[rel], rel))
    assert not diffs, _mismatch(case, diffs)


@pytest.mark.parametrize("case", GENERATE_CASES)
def test_generate_golden(case: str, tmp_path: Path) -> None:
    """``contractgen generate`` writes exactly the golden files (every target, every file)."""
    work = tmp_path / case
    shutil.copytree(GOLDEN / "generate" / case, work, ignore=shutil.ignore_patterns("expected"))
    if not (work / "contractgen.toml").exists():
        (work / "contractgen.toml").write_text("")
    done = cli_process("--root", work, "generate")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    _compare_tree(case, GOLDEN / "generate" / case / "expected", files_under(work / "generated"))


def test_the_shipped_contracts_render_into_the_committed_generated_tree(tmp_path: Path) -> None:
    """The product is its own golden: the shipped contracts, generated in a temporary project
    with the built-in targets, give exactly the files committed under generated/ (all four
    targets, all three files of each)."""
    from .helpers import ROOT

    work = tmp_path / "shipped"
    shutil.copytree(ROOT / "contracts", work / "contracts")
    (work / "contractgen.toml").write_text("")
    done = cli_process("--root", work, "generate")
    assert done.returncode == 0, done.stderr
    names = sorted(files_under(work / "generated"))
    assert len(names) == 16
    for target in ("sglang", "megatron", "launcher", "fsdp"):
        for file in ("__init__.py", "schema.py", "runtime_policy.py"):
            assert any(n.startswith(f"{target}/") and n.endswith(f"/{file}") for n in names)
    assert files_under(work / "generated") == files_under(
        ROOT / "generated"
    ), "generated/ is stale: run `.venv/bin/contractgen generate`"


@pytest.mark.parametrize("case", ERROR_CASES)
def test_error_golden(case: str, tmp_path: Path) -> None:
    """Bad input: exit 2, the golden stderr (one located line per problem), nothing written."""
    work = tmp_path / case
    shutil.copytree(GOLDEN / "errors" / case, work, ignore=shutil.ignore_patterns("stderr.txt"))
    (work / "contractgen.toml").write_text("")
    before = files_under(work)
    done = cli_process("--root", work, "generate")
    assert "Traceback" not in done.stderr
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert files_under(work) == before, "a failed generate must write nothing"
    assert not (work / "generated").exists()
    for line in done.stderr.splitlines():
        assert PROBLEM_LINE.match(line), f"not a file:line:col problem line: {line!r}"
    golden = GOLDEN / "errors" / case / "stderr.txt"
    if UPDATE_GOLDENS:
        golden.write_text(done.stderr)
        return
    expected = golden.read_text() if golden.exists() else ""
    assert done.stderr == expected, _mismatch(
        case, [_diff(expected.encode(), done.stderr.encode(), "stderr.txt")]
    )
