"""``.pre-commit-hooks.yaml`` and the sibling-repo CI recipe in docs/sibling-ci.md, run for real
against temporary repos."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .helpers import PACKAGES, ROOT, cli, cli_process, sibling_checkout

HOOKS = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
BY_ID = {h["id"]: h for h in HOOKS}
DOC = (ROOT / "docs" / "sibling-ci.md").read_text()
VERIFY = ROOT / BY_ID["contractgen-verify-vendored"]["entry"]
GENERATED_NAMES = ("__init__.py", "contracts.py", "schema.py", "runtime_policy.py")


def _synced_repo(tmp_path: Path, target: str) -> Path:
    repo = tmp_path / target
    shutil.copytree(ROOT / "generated" / target, repo)
    return repo


def test_hook_definitions() -> None:
    assert set(BY_ID) == {"contractgen-verify-vendored", "contractgen-check"}
    for hook in HOOKS:
        assert {"id", "name", "entry", "language", "files"} <= set(hook)
    verify = BY_ID["contractgen-verify-vendored"]
    assert verify["language"] == "script"  # runs from the hook checkout, nothing installed
    assert VERIFY.is_file() and os.access(VERIFY, os.X_OK)
    assert VERIFY.read_text().startswith("#!/usr/bin/env python3\n")
    assert BY_ID["contractgen-check"]["entry"] == "contractgen check"
    assert BY_ID["contractgen-check"]["pass_filenames"] is False


@pytest.mark.parametrize("package", [*PACKAGES.values(), "miles_megatron_plugins/true_on_policy"])
def test_hook_file_pattern(package: str) -> None:
    pattern = re.compile(BY_ID["contractgen-verify-vendored"]["files"])
    for name in GENERATED_NAMES:
        assert pattern.search(f"{package}/{name}")
    for other in ("config.py", "matmul.py", "norm.py"):
        assert not pattern.search(f"{package}/{other}")


def _run_verify(files: list[Path]) -> subprocess.CompletedProcess[str]:
    # exactly as pre-commit runs a `script` hook: the script with the changed files as arguments
    return subprocess.run(
        [str(VERIFY), *map(str, files)], capture_output=True, text=True, timeout=60
    )


def test_verify_hook_passes_then_catches_a_hand_edit(tmp_path: Path) -> None:
    repos = {t: _synced_repo(tmp_path, t) for t in PACKAGES}
    files = [repos[t] / PACKAGES[t] / n for t in PACKAGES for n in GENERATED_NAMES]
    ok = _run_verify(files)
    assert ok.returncode == 0, ok.stderr
    edited = repos["launcher"] / PACKAGES["launcher"] / "runtime_policy.py"
    edited.write_text(edited.read_text().replace('("const", "Ring")', '("const", "Tree")'))
    bad = _run_verify(files)
    assert bad.returncode == 1
    assert "hand-edited or not generated: runtime_policy.py" in bad.stderr


def test_verify_hook_needs_no_site_packages(tmp_path: Path) -> None:
    repo = _synced_repo(tmp_path, "sglang")
    files = [repo / PACKAGES["sglang"] / n for n in GENERATED_NAMES]
    done = subprocess.run(
        [sys.executable, "-S", "-I", str(VERIFY), *map(str, files)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_verify_hook_without_schema_py(tmp_path: Path) -> None:
    lone = tmp_path / "x" / "true_on_policy" / "runtime_policy.py"
    lone.parent.mkdir(parents=True)
    lone.write_text("")
    done = _run_verify([lone])
    assert done.returncode == 1
    assert "no generated schema.py" in done.stderr


def test_ci_recipe_yaml_blocks_parse() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC, re.S)
    assert len(blocks) >= 3
    workflow = yaml.safe_load(blocks[0])
    steps = workflow["jobs"]["vendored-contract"]["steps"]
    assert any('schema.py" --verify' in s.get("run", "") for s in steps)
    assert any("contractgen check --repo" in s.get("run", "") for s in steps)
    for block in blocks[1:]:
        yaml.safe_load(block)


def test_ci_recipe_check_from_inside_a_sibling_repo(tmp_path: Path) -> None:
    """`contractgen check --repo sglang=.` run in the sibling repo (no contractgen.toml there)."""
    repo = sibling_checkout(tmp_path / "sglang", "sglang")
    assert cli("--root", ROOT, "sync", "--repo", f"sglang={repo}").exit_code == 0
    done = cli_process("check", "--repo", "sglang=.", cwd=repo)
    assert done.returncode == 0, done.stdout + done.stderr
    (repo / PACKAGES["sglang"] / "schema.py").write_text("# gone\n")
    drift = cli_process("check", "--repo", "sglang=.", cwd=repo)
    assert drift.returncode == 1
    assert "stale: sglang:./python/sglang/srt/true_on_policy/schema.py" in drift.stdout


def test_ci_recipe_for_the_plugins_path(tmp_path: Path) -> None:
    """The Megatron fork recipe: a project with contracts + a contractgen.toml naming the path."""
    project = tmp_path / "cg"
    project.mkdir()
    shutil.copytree(ROOT / "contracts", project / "contracts")
    (project / "contractgen.toml").write_text(
        '[targets.megatron]\npackage = "miles_megatron_plugins/true_on_policy"\n'
    )
    repo = sibling_checkout(tmp_path / "Megatron-LM", "megatron")  # has miles_megatron_plugins/
    assert cli("--root", project, "generate").exit_code == 0
    assert cli("--root", project, "sync", "--repo", f"megatron={repo}").exit_code == 0
    assert cli("--root", project, "check", "--repo", f"megatron={repo}").exit_code == 0
    assert (repo / "miles_megatron_plugins" / "true_on_policy" / "schema.py").is_file()


# --- issue 12: the newcomer path -------------------------------------------------------------


def _quickstart_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Quickstart", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_readme_quickstart_is_two_commands_and_ci_runs_the_same_tests() -> None:
    commands = _quickstart_commands()
    assert commands == ["bash tools/quickstart.sh", ".venv/bin/python -m pytest -q"]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert commands[1] in ci  # .ci/run calls exactly the README's test command
    script = (ROOT / "tools" / "quickstart.sh").read_text()
    assert "tools/install-dev.sh" in script and ".venv/bin/contractgen parity" in script
    assert subprocess.run(["bash", "-n", str(ROOT / "tools" / "quickstart.sh")]).returncode == 0


def test_every_help_ends_with_an_example() -> None:
    from contractgen.cli import COMMANDS

    for verb in (None, *COMMANDS):
        args = ["--help"] if verb is None else [verb.replace("_", "-"), "--help"]
        result = cli(*args)
        assert result.exit_code == 0, (verb, result.output)
        tail = [line.strip() for line in result.output.strip().splitlines()[-2:]]
        assert tail[0] == "Example:" and tail[1].startswith("contractgen "), (verb, tail)


def test_cli_silences_megatron_import_warnings() -> None:
    code = "import contractgen.cli, megatron.core.models.backends, megatron.core.optimizer"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Apex" not in proc.stderr and "Transformer Engine" not in proc.stderr, proc.stderr


def test_readme_list_example_is_what_list_prints() -> None:
    """The README's ``contractgen list`` block is the command's output for the shipped contracts
    (a fingerprint change must update it)."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```\n\$ contractgen list\n(.*?)```", readme, re.S)
    assert block is not None, "README lost its `$ contractgen list` example"
    result = cli("--root", ROOT, "list")
    assert result.exit_code == 0, result.output
    assert block.group(1) == result.output
