"""Issue 55: a user's first day with adopt and sync on repos laid out like the public ones.

Each test failed on main before the change it covers: adopt bypassing the hand-edit guard, a sync
that half-applies, usage errors exiting 1, Ctrl-C as ``Aborted!``, bytecode left in a user's repo.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from contractgen.codegen import sync as sync_module

from .helpers import ROOT, cli, files_under
from .public_layouts import REPOS, make_repos


@pytest.fixture
def repos(tmp_path: Path) -> dict[str, Path]:
    return make_repos(tmp_path / "repos")


def _policy(repos: dict[str, Path], repo: str) -> Path:
    return repos[repo] / REPOS[repo][1] / "runtime_policy.py"


def _adopted(repos: dict[str, Path], repo: str = "Megatron-LM") -> Path:
    result = cli("--root", ROOT, "adopt", "--repo", f"{repo}={repos[repo]}")
    assert result.exit_code == 0, result.output + result.stderr
    return _policy(repos, repo)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


# 1. adopt keeps sync's hand-edit guard -------------------------------------------------------


def test_adopt_refuses_a_hand_edited_stamped_file_and_lists_the_change(repos) -> None:
    policy = _adopted(repos)
    _edit(policy, '("const", True)', '("const", False)')
    before = files_under(repos["Megatron-LM"])
    result = cli("--root", ROOT, "adopt", "--repo", f"Megatron-LM={repos['Megatron-LM']}")
    assert result.exit_code == 1, result.output + result.stderr
    assert f"refused: {policy}: edited by hand" in result.stderr
    assert re.search(r'- .*\("const", False\)', result.stderr)  # the changed value, both ways
    assert re.search(r'\+ .*\("const", True\)', result.stderr)
    assert "adopt: nothing written" in result.stderr
    assert files_under(repos["Megatron-LM"]) == before
    forced = cli(
        "--root", ROOT, "adopt", "--repo", f"Megatron-LM={repos['Megatron-LM']}", "--force"
    )
    assert forced.exit_code == 0, forced.output + forced.stderr
    assert '("const", False)' not in policy.read_text()


def test_adopt_refuses_a_stamped_file_with_merge_conflict_markers(repos) -> None:
    policy = _adopted(repos)
    text = policy.read_text()
    policy.write_text(text + "<<<<<<< HEAD\nX = 1\n=======\nX = 2\n>>>>>>> theirs\n")
    result = cli("--root", ROOT, "adopt", "--repo", f"Megatron-LM={repos['Megatron-LM']}")
    assert result.exit_code == 1
    assert "holds merge-conflict markers" in result.stderr and "does not parse" in result.stderr
    assert "<<<<<<< HEAD" in policy.read_text()


def test_adopt_leaves_no_bytecode_in_the_repo(repos) -> None:
    _adopted(repos)
    caches = [p for p in repos["Megatron-LM"].rglob("__pycache__")]
    assert caches == []


# 3. adopt creates no package a repo lacks unless asked; check covers the ones it holds --------

FSDP_PACKAGE = "miles/backends/fsdp_utils/true_on_policy"


def test_adopt_skips_a_package_the_repo_lacks_and_check_says_so(repos) -> None:
    miles = repos["miles"]
    assert not (miles / FSDP_PACKAGE).exists()  # like the real miles: no FSDP package to adopt
    result = cli("--root", ROOT, "adopt", "--repo", f"miles={miles}")
    assert result.exit_code == 0, result.output + result.stderr
    assert not (miles / FSDP_PACKAGE).exists()
    assert f"note: fsdp: {miles} has no {FSDP_PACKAGE}/" in result.output
    assert "--allow-new-package" in result.output
    checked = cli("--root", ROOT, "check", "--repo", f"miles={miles}")
    assert checked.exit_code == 0, checked.output + checked.stderr
    assert f"note: fsdp:{miles.as_posix()}: no {FSDP_PACKAGE}/ in this repo, not checked" in (
        checked.output
    )
    required = cli("--root", ROOT, "check", "--repo", f"fsdp={miles}")  # named: required
    assert required.exit_code == 1, required.output + required.stderr


def test_allow_new_package_writes_a_complete_package_and_says_nothing_imports_it(repos) -> None:
    miles = repos["miles"]
    result = cli("--root", ROOT, "adopt", "--repo", f"miles={miles}", "--allow-new-package")
    assert result.exit_code == 0, result.output + result.stderr
    assert "new package, not imported by the repo" in result.output
    written = sorted(p.name for p in (miles / FSDP_PACKAGE).iterdir())
    assert written == ["__init__.py", "contracts.py", "runtime_policy.py", "schema.py"]
    checked = cli("--root", ROOT, "check", "--repo", f"miles={miles}")
    assert checked.exit_code == 0, checked.output + checked.stderr
    assert "not checked" not in checked.output
    _edit(miles / FSDP_PACKAGE / "contracts.py", "\n", "\n# hand edit\n")
    edited = cli("--root", ROOT, "check", "--repo", f"miles={miles}")
    assert edited.exit_code == 1, edited.output  # the package it holds is checked


# 2. plan every write first; roll back; one line for OS errors and interrupts ------------------


def _all(repos: dict[str, Path]) -> list[str]:
    return [a for name in ("sglang", "Megatron-LM") for a in ("--repo", f"{name}={repos[name]}")]


def test_an_unwritable_folder_stops_the_whole_sync_before_any_write(repos, monkeypatch) -> None:
    blocked = repos["sglang"]
    real = os.access
    monkeypatch.setattr(
        sync_module.os,
        "access",
        lambda p, mode: False
        if Path(p).resolve().is_relative_to(blocked.resolve())
        else real(p, mode),
    )  # fmt: skip (root may write anywhere: the check is what is tested)
    before = {name: files_under(repos[name]) for name in ("sglang", "Megatron-LM")}
    result = cli("--root", ROOT, "sync", *_all(repos), "--force")
    assert result.exit_code == 1, result.output + result.stderr
    assert "not writable (permission denied)" in result.stderr
    assert "Traceback" not in result.output + result.stderr
    assert {name: files_under(repos[name]) for name in before} == before


def test_a_write_that_fails_midway_is_rolled_back_in_every_repo(repos, monkeypatch) -> None:
    before = {name: files_under(repos[name]) for name in ("sglang", "Megatron-LM")}
    real = sync_module.atomic_write
    calls = []

    def flaky(dest: Path, content: bytes) -> None:
        calls.append(dest)
        if len(calls) == 5:
            raise PermissionError(13, "Permission denied", str(dest))
        real(dest, content)

    monkeypatch.setattr(sync_module, "atomic_write", flaky)
    result = cli("--root", ROOT, "sync", *_all(repos), "--force")
    assert result.exit_code == 2, result.output + result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Permission denied" in lines[0] and "put back" in lines[0]
    assert {name: files_under(repos[name]) for name in before} == before


def test_ctrl_c_is_one_line_and_exit_130(repos, monkeypatch) -> None:
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sync_module, "plan_sync", interrupted)
    result = cli("--root", ROOT, "sync", *_all(repos))
    assert result.exit_code == 130
    assert "Aborted!" not in result.output + result.stderr
    assert "interrupted" in result.stderr
