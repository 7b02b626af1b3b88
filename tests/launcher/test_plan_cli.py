"""``contractgen plan`` as a command: exit codes, streams and flags (the surface users rely on)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from contractgen.cli import main

V1 = "qwen3_dense_true_on_policy_v1"
ROOT = Path(__file__).resolve().parents[2]


def _plan(*args: str, env: dict | None = None, root: str | None = None):
    pre = ["--root", root] if root else []
    return CliRunner().invoke(main, [*pre, "plan", *args], env={"NCCL_ALGO": None, **(env or {})})


@pytest.mark.parametrize(
    "contract_id",
    [
        "qwen3_dense_true_on_policy_v2",
        "qwen3_moe_true_on_policy_v1",
        "llama3_dense_true_on_policy_v1",
    ],
)
def test_plan_refuses_a_contract_a_side_does_not_implement(
    contract_id: str, tmp_path: Path
) -> None:
    """contractgen's own config is the public stack (each repo implements dense v1 only): a plan
    for another contract names every side that does not implement it (issue 30)."""
    result = _plan("--contract", contract_id)
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == f"error: refusing to plan {contract_id}: not every side implements it:"
    assert [line.split(" (")[0].strip() for line in lines[1:4]] == [
        "the rollout", "the trainer", "the launcher",
    ]  # fmt: skip
    assert all(line.endswith(f"implements only {V1}") for line in lines[1:4])
    # one side short is enough, and only that side is named
    root = tmp_path / "p"
    shutil.copytree(ROOT / "contracts", root / "contracts")
    (root / "contractgen.toml").write_text(f'[targets.megatron]\ncontracts = ["{V1}"]\n')
    one = _plan("--contract", contract_id, root=str(root))
    assert one.exit_code == 2
    assert one.stderr.splitlines()[1:2] == [
        f"  the trainer (Megatron-LM; contractgen.toml targets.megatron.contracts) implements "
        f"only {V1}"
    ]
    assert "the rollout" not in one.stderr and "the launcher" not in one.stderr


def test_valid_layout_exits_0_and_warns_about_the_unreleased_flag() -> None:
    result = _plan("--contract", V1, "--tp", "2", "--format", "json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["layout"]["train"]["world"] == 2
    assert result.stderr == (
        "warning: a real SGLang rollout computes attention (FA3), norms, RoPE and the activation "
        "with its own kernels, which nothing here compares (see the plan's 'real SGLang' lines)\n"
        "warning: --true-on-policy-contract needs a newer SGLang than 0.5.23 (from the unmerged "
        "true-on-policy PR of sgl-project/sglang, branch sglang-miles)\n"
    )
    assert [u["op"] for u in data["unproven_on_real_sglang"]] == [
        "attention", "RMSNorm and QK-norm", "RoPE", "SwiGLU activation", "row-parallel linear",
    ]  # fmt: skip


def test_plan_renders_dropout_off_and_refuses_trainer_args_that_turn_it_on() -> None:
    """Issue 31: megatron-core defaults attention and hidden dropout to 0.1 (a random, off-policy
    trainer forward); the plan renders both 0 and refuses your own args that undo it."""
    data = json.loads(_plan("--contract", V1, "--tp", "2", "--format", "json").stdout)
    args = data["megatron_args"]
    for flag in ("--attention-dropout", "--hidden-dropout"):
        assert args[args.index(flag) + 1] == "0.0"
    ok = _plan("--contract", V1, "--trainer-args", "--hidden-dropout 0 --attention-dropout=0.0")
    assert ok.exit_code == 0, ok.stderr
    for extra, named in (("--hidden-dropout 0.1", "--hidden-dropout 0.1: the plan renders "
                          "--hidden-dropout 0.0"), ("--attention-dropout=0.05", "--attention-dropout "
                          "0.05"), ("--sequence-parallel", "--sequence-parallel: never pass it")):  # fmt: skip
        refused = _plan("--contract", V1, "--tp", "2", "--trainer-args", extra)
        assert refused.exit_code == 2 and refused.stdout == ""
        assert refused.stderr.startswith("error: --trainer-args undo the plan's determinism:\n")
        assert named in refused.stderr


def test_invalid_layout_exits_2_on_stderr_only() -> None:
    result = _plan("--contract", V1, "--pp", "3")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: invalid layout for {V1} on Qwen3-0.6B:\n  --pp 3: ")


def test_usage_errors_exit_2() -> None:
    assert _plan("--tp", "2").exit_code == 2  # no --contract
    assert _plan("--contract", V1, "--tp", "0").exit_code == 2
    assert _plan("--contract", V1, "--format", "yaml").exit_code == 2
    unknown = _plan("--contract", "nope")
    assert unknown.exit_code == 2
    assert unknown.stderr.startswith("error: unknown true-on-policy contract 'nope'; known: ")


def test_environment_nccl_algo_is_kept() -> None:
    result = _plan("--contract", V1, "--format", "shell", env={"NCCL_ALGO": "Tree"})
    assert "export NCCL_ALGO=Tree\n" in result.stdout


def test_flags_are_frozen() -> None:
    """The public flags of `plan` (DESIGN.md's command line, plus --rollout-dp/--world/--model,
    --ep for MoE contracts and --lora-adapter for LoRA contracts)."""
    from contractgen.commands.plan import command

    flags = sorted(opt for p in command.params for opt in p.opts)
    assert flags == [
        "--contract", "--cp", "--dp", "--ep", "--format", "--lora-adapter", "--model", "--pp", "--rollout-dp",
        "--rollout-tp", "--tp", "--trainer-args", "--world",
    ]  # fmt: skip


def _all_contracts_project(tmp_path: Path) -> str:
    """A project whose targets declare no contract set: each implements every contract."""
    shutil.copytree(ROOT / "contracts", tmp_path / "contracts")
    (tmp_path / "contractgen.toml").write_text("")
    return str(tmp_path)


def test_ep_plan_warns_that_ep_is_forward_only(tmp_path: Path) -> None:
    result = _plan("--contract", "qwen3_moe_true_on_policy_v1", "--model", "reference",
                   "--tp", "2", "--ep", "2", root=_all_contracts_project(tmp_path))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "warning: --ep 2: contractgen gates expert parallelism in the forward only" in (
        result.stderr
    )
    assert "--expert-model-parallel-size 2" in result.stdout
