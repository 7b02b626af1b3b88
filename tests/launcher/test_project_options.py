"""Issue 12: ``plan`` and ``handshake`` honour ``--root``, ``--contracts`` and contractgen.toml
(a contract ``list`` shows is known to ``plan``; a configured package path is where handshake
looks)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from contractgen.cli import main
from contractgen.codegen.vendored import CONTRACTS_ENV, ROOT_ENV, load_target

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"
V1 = "qwen3_dense_true_on_policy_v1"


@pytest.fixture(autouse=True)
def _restore_builtin_project(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield
    monkeypatch.delenv(ROOT_ENV, raising=False)
    monkeypatch.delenv(CONTRACTS_ENV, raising=False)
    load_target.cache_clear()


def _run(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


def _own_contracts(tmp_path: Path) -> Path:
    folder = tmp_path / "mine"
    folder.mkdir()
    text = (CONTRACTS / f"{V1}.yaml").read_text().replace(f"id: {V1}", "id: mine_v1")
    (folder / "mine_v1.yaml").write_text(text)
    return folder


def test_plan_knows_the_contracts_list_shows(tmp_path: Path) -> None:
    folder = _own_contracts(tmp_path)
    assert "mine_v1" in _run("--contracts", folder, "list").output
    result = _run("--contracts", folder, "plan", "--contract", "mine_v1", "--tp", "2")
    assert result.exit_code == 0, (result.output, result.stderr)
    assert "--true-on-policy-contract mine_v1" in result.output
    # and the built-in contracts are not known in that project
    result = _run("--contracts", folder, "plan", "--contract", V1)
    assert result.exit_code == 2 and "mine_v1" in result.stderr


def test_plan_reads_the_root_project(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    shutil.copytree(_own_contracts(tmp_path), root / "contracts")
    (root / "contractgen.toml").write_text("")
    result = _run("--root", root, "plan", "--contract", "mine_v1")
    assert result.exit_code == 0, (result.output, result.stderr)


def test_a_command_run_in_process_leaves_no_project_selected(tmp_path: Path) -> None:
    """``plan --root`` selects its project for that command only: afterwards this process reads
    the built-in targets again, even with the project's folder gone (a temporary project was
    once left selected, and a later test's trainer rank read its deleted contracts)."""
    root = tmp_path / "proj"
    shutil.copytree(_own_contracts(tmp_path), root / "contracts")
    (root / "contractgen.toml").write_text("")
    assert load_target("sglang").origin == "generated/"
    result = _run("--root", root, "plan", "--contract", "mine_v1")
    assert result.exit_code == 0, (result.output, result.stderr)
    assert ROOT_ENV not in os.environ and CONTRACTS_ENV not in os.environ
    shutil.rmtree(root)
    target = load_target("sglang")
    assert target.origin == "generated/"
    assert V1 in target.schema.CONTRACT_IDS and "mine_v1" not in target.schema.CONTRACT_IDS


def test_handshake_uses_the_configured_package_path(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    shutil.copytree(CONTRACTS, root / "contracts")
    (root / "contractgen.toml").write_text(
        '[targets.megatron]\npackage = "miles_megatron_plugins/true_on_policy"\n'
    )
    rollout, trainer = tmp_path / "sglang", tmp_path / "Megatron-LM"
    (rollout / "python/sglang/srt").mkdir(parents=True)
    (trainer / "miles_megatron_plugins").mkdir(parents=True)
    synced = _run(
        "--root", root, "sync", "--repo", f"sglang={rollout}", "--repo", f"megatron={trainer}"
    )
    assert synced.exit_code == 0, (synced.output, synced.stderr)
    assert (trainer / "miles_megatron_plugins/true_on_policy/schema.py").is_file()
    args = ("handshake", "--rollout", rollout, "--trainer", trainer, "--contract", V1)
    result = _run("--root", root, *args)
    assert result.exit_code == 0, (result.output, result.stderr)
    assert "handshake ok" in result.output
