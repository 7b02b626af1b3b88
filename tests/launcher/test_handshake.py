"""The rollout/trainer handshake on vendored copies written by ``contractgen sync`` into tmp repos.

The three refusals the launcher must make: a different contract, a different version of the
contract (naming the newer one), a hand-edited copy; plus a stale copy and a copy that does not
know the contract.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from contractgen.adapters.launcher.handshake import (
    HandshakeError,
    HandshakeReport,
    check_handshake,
    handshake_report,
)
from contractgen.cli import main
from contractgen.codegen.vendored import load_target

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"
V1, V2 = "qwen3_dense_true_on_policy_v1", "qwen3_dense_true_on_policy_v2"
V3, V4 = "qwen3_dense_true_on_policy_v3", "qwen3_dense_true_on_policy_v4"
SGLANG_PKG = "python/sglang/srt/true_on_policy"
MEGATRON_PKG = "miles_megatron_plugins/true_on_policy"


def _project(where: Path, contracts: Path | None = None, config: str = "") -> Path:
    """A project with the shipped contracts (or ``contracts``) whose targets declare no contract
    set (so each vendors every contract), unless ``config`` says otherwise."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "contractgen.toml").write_text(config)
    if not (where / "contracts").exists():
        shutil.copytree(contracts or CONTRACTS, where / "contracts")
    return where


def _sync(repo: Path, target: str, contracts: Path | None = None, root: Path | None = None) -> None:
    """Sync ``target`` into ``repo``, made a checkout that has the folder its package goes in."""
    (repo / {"sglang": SGLANG_PKG, "megatron": MEGATRON_PKG}[target]).parent.mkdir(
        parents=True, exist_ok=True
    )
    if root is None:
        root = _project(repo.parent / f".project-{repo.name}", contracts)
    result = CliRunner().invoke(main, ["--root", str(root), "sync", "--repo", f"{target}={repo}"])
    assert result.exit_code == 0, result.output


@pytest.fixture
def repos(tmp_path: Path) -> tuple[Path, Path]:
    """A freshly synced SGLang repo and Megatron-LM repo, each implementing every contract."""
    rollout, trainer = tmp_path / "sglang", tmp_path / "Megatron-LM"
    _sync(rollout, "sglang")
    _sync(trainer, "megatron")
    return rollout / SGLANG_PKG, trainer / MEGATRON_PKG


def _contracts_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "contracts"
    shutil.copytree(CONTRACTS, copy)
    return copy


def _refusal(rollout: HandshakeReport, trainer: HandshakeReport) -> HandshakeError:
    with pytest.raises(HandshakeError) as info:
        check_handshake(rollout, trainer)
    return info.value


@pytest.mark.parametrize("contract_id", load_target("launcher").schema.CONTRACT_IDS)
def test_same_contract_same_copy_starts(repos: tuple[Path, Path], contract_id: str) -> None:
    rollout, trainer = repos
    agreed = check_handshake(
        handshake_report(rollout, contract_id, "rollout"),
        handshake_report(trainer, contract_id, "trainer"),
    )
    assert agreed == f"{contract_id} {load_target('launcher').schema.FINGERPRINTS[contract_id]}"


def test_different_version_names_the_newer(repos: tuple[Path, Path]) -> None:
    rollout, trainer = repos
    error = _refusal(
        handshake_report(rollout, V1, "rollout"), handshake_report(trainer, V2, "trainer")
    )
    assert error.kind == "different_version"
    assert str(error) == (
        f"refusing to start: different versions of the contract: the rollout runs {V1}, the "
        f"trainer runs {V2}; {V1} is superseded by {V4}: run both sides with "
        f"--true-on-policy-contract {V4}"
    )


def test_different_contract(tmp_path: Path, repos: tuple[Path, Path]) -> None:
    contracts = _contracts_copy(tmp_path)
    other = "qwen3_dense_experimental_v1"
    text = (contracts / f"{V1}.yaml").read_text().replace(f"id: {V1}", f"id: {other}")
    (contracts / f"{other}.yaml").write_text(text)
    rollout_repo = tmp_path / "sglang-experimental"
    _sync(rollout_repo, "sglang", contracts)
    _, trainer = repos
    error = _refusal(
        handshake_report(rollout_repo / SGLANG_PKG, other, "rollout"),
        handshake_report(trainer, V1, "trainer"),
    )
    assert error.kind == "different_contract"
    assert str(error) == (
        f"refusing to start: different contracts: the rollout runs {other}, the trainer runs "
        f"{V1}; their logprobs are not comparable: run both sides with the same contract"
    )


def test_hand_edited_copy(repos: tuple[Path, Path]) -> None:
    rollout, trainer = repos
    schema = trainer / "schema.py"
    schema.write_text(
        schema.read_text().replace('"attention_kv_chunk": 64', '"attention_kv_chunk": 32')
    )
    error = _refusal(
        handshake_report(rollout, V1, "rollout"), handshake_report(trainer, V1, "trainer")
    )
    assert error.kind == "hand_edited"
    assert str(error) == (
        f"refusing to start: the trainer's vendored {schema} was edited by hand (its body no "
        "longer matches the sha256 in its header); regenerate it with `contractgen sync --force`"
    )


def test_a_blank_line_is_a_hand_edit_and_so_is_code(repos: tuple[Path, Path]) -> None:
    """The public stack's copies differed by one blank line. The stamp covers the file's bytes
    (each repo's formatters keep the rendered form, ``[targets.NAME.format]``), so that blank
    line is an edit the handshake sees, as is any change of the code."""
    rollout, trainer = repos
    schema = rollout / "schema.py"
    original = schema.read_text()
    assert handshake_report(rollout, V1, "rollout").intact
    schema.write_text(original.replace("Literal\n\nSCHEMA_VERSION", "Literal\nSCHEMA_VERSION", 1))
    assert schema.read_text() != original
    assert not handshake_report(rollout, V1, "rollout").intact
    schema.write_text(original.replace("GENERATOR_FORMAT = 3", "GENERATOR_FORMAT = 4", 1))
    assert schema.read_text() != original
    assert not handshake_report(rollout, V1, "rollout").intact


def test_stale_copy_of_the_same_contract(tmp_path: Path, repos: tuple[Path, Path]) -> None:
    """Same id, different data: one side was synced from an older edit of the contract."""
    contracts = _contracts_copy(tmp_path)
    path = contracts / f"{V1}.yaml"
    path.write_text(path.read_text().replace("attention_kv_chunk: 64", "attention_kv_chunk: 32"))
    stale_repo = tmp_path / "Megatron-LM-stale"
    _sync(stale_repo, "megatron", contracts)
    rollout, _ = repos
    stale = handshake_report(stale_repo / MEGATRON_PKG, V1, "trainer")
    assert stale.intact  # a faithful copy of different data: not a hand edit
    error = _refusal(handshake_report(rollout, V1, "rollout"), stale)
    assert error.kind == "stale_copy"
    assert str(error).startswith(
        f"refusing to start: both sides run {V1} but their vendored copies disagree"
    )


def test_copy_that_does_not_know_the_contract(tmp_path: Path, repos: tuple[Path, Path]) -> None:
    contracts = _contracts_copy(tmp_path)
    (contracts / f"{V2}.yaml").unlink()
    (contracts / f"{V3}.yaml").unlink()  # supersedes V2
    (contracts / f"{V4}.yaml").unlink()  # supersedes V3
    old_repo = tmp_path / "sglang-old"
    _sync(old_repo, "sglang", contracts)
    _, trainer = repos
    error = _refusal(
        handshake_report(old_repo / SGLANG_PKG, V2, "rollout"),
        handshake_report(trainer, V2, "trainer"),
    )
    assert error.kind == "not_implemented"
    known = ", ".join(sorted(path.stem for path in contracts.glob("*.yaml")))
    assert V1 in known and V2 not in known
    assert str(error).startswith(
        f"refusing to start: the rollout does not implement {V2} (the rollout's vendored "
        f"{old_repo / SGLANG_PKG / 'schema.py'} carries only {known}); "
    )


@pytest.mark.parametrize("contract_id", [V2, "qwen3_moe_true_on_policy_v1"])
def test_the_public_stack_implements_v1_only(tmp_path: Path, contract_id: str) -> None:
    """Synced with contractgen's own config (the public layout: every target declares dense v1),
    the handshake refuses any other contract and names the sides that do not implement it."""
    rollout, trainer = tmp_path / "sglang", tmp_path / "Megatron-LM"
    for repo, target in ((rollout, "sglang"), (trainer, "megatron")):
        (repo / {"sglang": SGLANG_PKG, "megatron": MEGATRON_PKG}[target]).parent.mkdir(parents=True)
        result = CliRunner().invoke(main, ["sync", "--repo", f"{target}={repo}"])
        assert result.exit_code == 0, result.output
    args = ["handshake", "--rollout", str(rollout), "--trainer", str(trainer), "--contract"]
    ok = CliRunner().invoke(main, [*args, V1])
    assert ok.exit_code == 0, ok.output
    refused = CliRunner().invoke(main, [*args, contract_id])
    assert refused.exit_code == 1
    assert refused.stderr.startswith(
        f"error: refusing to start: the rollout and the trainer do not implement {contract_id} "
        f"(the rollout's vendored {rollout / SGLANG_PKG / 'schema.py'} carries only {V1}; "
        f"the trainer's vendored {trainer / MEGATRON_PKG / 'schema.py'} carries only {V1}); "
    )


def test_missing_copy(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="rollout: no vendored schema.py at"):
        handshake_report(tmp_path, V1, "rollout")


def test_handshake_cli_exit_codes(repos: tuple[Path, Path]) -> None:
    rollout, trainer = repos
    runner = CliRunner()
    ok = runner.invoke(main, ["handshake", "--rollout", str(rollout.parents[3]), "--trainer", str(trainer.parents[1]), "--contract", V1])  # fmt: skip
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.startswith(f"handshake ok: {V1} sha256:")
    mismatch = runner.invoke(main, ["handshake", "--rollout", str(rollout), "--trainer", str(trainer), "--rollout-contract", V1, "--trainer-contract", V2])  # fmt: skip
    assert mismatch.exit_code == 1
    assert "different versions of the contract" in mismatch.stderr
    usage = runner.invoke(main, ["handshake", "--rollout", str(rollout), "--trainer", str(trainer)])
    assert usage.exit_code == 2
