"""Issue 55, item 6: ``plan`` speaks miles. One ``train.py`` command carries SGLang's arguments
as ``--sglang-*`` (miles starts the engines), leaves out what miles sets itself, lists each flag
once, and says which arguments the user must add."""

from __future__ import annotations

import shlex

import pytest

from contractgen.adapters.launcher.formats import to_json_data, to_shell, to_text
from contractgen.adapters.launcher.layout import Layout
from contractgen.adapters.launcher.miles_form import once, sglang_args_for_miles
from contractgen.adapters.launcher.plan import build_plan

V1 = "qwen3_dense_true_on_policy_v1"


@pytest.fixture(scope="module")
def plan():
    return build_plan(V1, Layout(tp=2, rollout_tp=2))


def test_sglang_arguments_in_miles_form() -> None:
    plain = ["--model-path", "Qwen3-0.6B", "--tp-size", "2", "--dp-size", "1",
             "--enable-deterministic-inference", "--attention-backend", "fa3",
             "--no-enable-fused-qk-norm-rope"]  # fmt: skip
    assert sglang_args_for_miles(plain) == (
        "--sglang-dp-size", "1", "--sglang-enable-deterministic-inference",
        "--sglang-attention-backend", "fa3", "--no-sglang-enable-fused-qk-norm-rope",
    )  # fmt: skip


def test_once_keeps_each_flag_once_and_refuses_two_values() -> None:
    args = ["--bf16", "--tp", "2", "--bf16", "--tp", "2", "--x"]
    assert once(args) == ("--bf16", "--tp", "2", "--x")
    with pytest.raises(ValueError, match="--tp"):
        once(["--tp", "2", "--tp", "4"])


def test_the_miles_command_carries_every_side_once(plan) -> None:
    command = plan.trainer_command
    assert command[:2] == ("python", "train.py")
    flags = [a for a in command if a.startswith("--")]
    assert len(flags) == len(set(flags)), flags  # each flag once
    assert "--sglang-attention-backend" in flags and "--attention-backend" in flags  # two sides
    assert "--sglang-model-path" not in flags and "--sglang-tp-size" not in flags  # miles' own
    assert command[command.index("--rollout-num-gpus-per-engine") + 1] == "2"
    for arg in plan.args("megatron") + plan.args("miles"):
        assert arg in command


def test_text_shell_and_json_say_what_to_add_and_list_each_flag_once(plan) -> None:
    text = to_text(plan)
    assert "add to it what no contract knows:" in text and "--hf-checkpoint PATH" in text
    assert f"  {shlex.join(plan.trainer_command)}\n" in text
    for heading in ("Megatron arguments:", "SGLang server arguments:"):
        table = text.split(heading, 1)[1].split("\n\n", 1)[0].splitlines()
        shown = [line.split()[0] for line in table if line.strip()]
        assert len(shown) == len(set(shown)), shown
    assert "also megatron.batch_invariant_mode" in text  # the second source, on the one line
    shell = to_shell(plan)
    assert shell.splitlines()[-1] == shlex.join(plan.trainer_command)
    assert "# add: --hf-checkpoint PATH" in shell
    added = to_json_data(plan)["commands"]["you_add"]
    assert added[0]["args"] == "--hf-checkpoint PATH"


def test_the_sglang_part_parses_under_the_prefix_as_the_plain_flags_do(plan, sglang_probe):
    """SGLang's own parser (the release), once as is and once with every option under
    ``--sglang-`` (how ``train.py`` registers them): the miles form sets the same fields to the
    same values as the plain server arguments, and leaves unknown the same flags."""
    plain = list(plan.args("sglang"))
    miles = list(sglang_args_for_miles(plain))
    as_plain = sglang_probe([["--model-path", "m", *plain]], [])["parsed"][0]
    as_miles = sglang_probe([["--sglang-model-path", "m", *miles]], [], prefix="sglang-")
    as_miles = as_miles["parsed"][0]
    assert "error" not in as_plain and "error" not in as_miles, (as_plain, as_miles)
    expected = {k: v for k, v in as_plain["set"].items() if k not in ("model_path", "tp_size")}
    got = {k.removeprefix("sglang_"): v for k, v in as_miles["set"].items()}
    got.pop("model_path")
    assert got == expected and expected
    unknown = [a for a in as_plain["unknown"] if a.startswith("--")]
    assert unknown  # the flags of the unreleased true-on-policy PR
    assert list(sglang_args_for_miles(unknown)) == [
        a for a in as_miles["unknown"] if a.startswith("--")
    ]
