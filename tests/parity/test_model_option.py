"""``parity --model NAME``: a random-weight checkpoint of one of the profile's models, written to
a temporary folder and gated as ``--checkpoint`` would gate it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import V1, run_parity, run_parity_in_process

REFERENCE = "qwen3-tiny-random"  # v1's reference model


def test_the_reference_model_by_name_is_written_and_gated(tmp_path: Path) -> None:
    code, report, out = run_parity(
        "--model", REFERENCE, "--layouts", "tp1,tp2", "--rollout-tps", "1", "--no-reference",
        tmp_path=tmp_path,
    )  # fmt: skip
    assert code == 0, out
    assert [lay["name"] for lay in report["layouts"]] == ["tp1", "tp2"]
    assert all(lay["exact"] and lay["tokens_compared"] == 40 for lay in report["layouts"]), out


def test_the_written_checkpoint_has_the_profiles_dims(tmp_path: Path) -> None:
    from contractgen.codegen.vendored import load_target
    from contractgen.parity.random_model import write_random_checkpoint

    profile = load_target("sglang").schema.model_profile_for(V1)
    out, n = write_random_checkpoint(V1, REFERENCE, tmp_path / "ckpt")
    config = json.loads((out / "config.json").read_text())
    ref = profile.reference_model
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (
        ref.hidden_size, ref.num_layers, ref.vocab_size,
    )  # fmt: skip
    assert config["architectures"] == [profile.hf_architecture]
    assert n > 0 and list(out.glob("*.safetensors"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model", "Qwen3-7B"), "error: --model 'Qwen3-7B': not a checkpoint of the qwen3_dense "
         f"profile of {V1}; known: Qwen3-0.6B"),
        (("--model", REFERENCE, "--checkpoint", "."), "error: --model and --checkpoint cannot be "
         "combined"),
    ],
)  # fmt: skip
def test_bad_model_options_exit_2_before_anything_is_written(tmp_path, args, message) -> None:
    code, report, out = run_parity_in_process(*args, tmp_path=tmp_path)
    assert code == 2 and report is None and "Traceback" not in out, out
    assert message in out, out
