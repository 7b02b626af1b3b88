"""LoRA under a contract (issue 34): schema rules, the rollout's adapter path, its sensitivity to
every lora_* field, the peft reference, and the CLI's refusals.

Single-process and tiny (the contract's reference model, 24 tokens) except the one end-to-end
gate run, marked slow."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from contractgen.adapters.common.lora import check_adapter, random_adapter
from contractgen.adapters.sglang.model import KVCache, ReferenceModel, random_weights
from contractgen.adapters.sglang.session import model_arch, policies
from contractgen.cli import main
from contractgen.parity.faults import flipped
from contractgen.parity.harness import bits
from contractgen.schema.models import Contract
from contractgen.schema.rules import check_lora

QWEN = "qwen3_dense_lora_true_on_policy_v1"
LLAMA = "llama3_dense_lora_true_on_policy_v1"
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_FIELDS = (
    "lora_adapter_dtype",
    "lora_low_rank_dtype",
    "lora_matmul",
    "lora_scale_at",
    "lora_scale_dtype",
    "lora_add_dtype",
    "lora_serving",
)


def _logits(contract: str, adapter: bool, kernel_changes=None, dtype=None, alpha=12.0):
    _, kp, rp = policies(contract, 1, dtype, kernel_changes or {}, {})
    arch, _ = model_arch(contract, {})
    weights = random_weights(arch, 0)
    if adapter:
        weights |= random_adapter(arch, MODULES, 8, alpha)
    ids = torch.arange(24) * 37 % arch.vocab_size
    model = ReferenceModel(arch, weights, kp, rp)
    return model.forward(ids, [KVCache()], [24], all_logits=True), ids, (arch, weights)


@pytest.fixture(scope="module")
def lora_logits():
    return _logits(QWEN, adapter=True)[0]


def test_existing_contracts_keep_their_fingerprints() -> None:
    """Adding the lora section and lora_* fields moved no shipped contract's fingerprint."""
    from contractgen.codegen.vendored import load_target

    schema = load_target("sglang").schema
    assert schema.FINGERPRINTS["qwen3_dense_true_on_policy_v2"].startswith("sha256:53daab895352")
    assert schema.FINGERPRINTS["llama3_dense_true_on_policy_v1"].startswith("sha256:604387c3daf8")
    assert "lora" not in schema.CONTRACT_DATA["qwen3_dense_true_on_policy_v2"]
    assert schema.CONTRACT_DATA[QWEN]["lora"]["target_modules"] == list(MODULES)


def test_rules_refuse_half_a_lora_contract_and_moe() -> None:
    from contractgen.codegen.vendored import load_target

    data = load_target("sglang").schema.CONTRACT_DATA
    no_section = {k: v for k, v in data[QWEN].items() if k != "lora"}
    found = dict(check_lora(Contract.model_validate(no_section, strict=False)))
    assert found["kernel_policy.lora_matmul"].startswith("must be absent: the contract has no lora")
    moe = dict(data["qwen3_moe_true_on_policy_v2"])
    moe["lora"] = data[QWEN]["lora"]
    moe["kernel_policy"] = {**moe["kernel_policy"], **{f: data[QWEN]["kernel_policy"][f]
                                                       for f in LORA_FIELDS}}  # fmt: skip
    found = dict(check_lora(Contract.model_validate(moe, strict=False)))
    assert found["lora"].startswith("must be absent: LoRA on qwen3_moe's experts")
    wrong_dtype = {**data[QWEN], "kernel_policy": {**data[QWEN]["kernel_policy"],
                                                   "lora_adapter_dtype": "float32"}}  # fmt: skip
    found = dict(check_lora(Contract.model_validate(wrong_dtype, strict=False)))
    assert "must equal dense_math_dtype (bfloat16)" in found["kernel_policy.lora_adapter_dtype"]


def test_adapter_changes_the_model_and_is_deterministic(lora_logits) -> None:
    base = _logits(QWEN, adapter=False)[0]
    again = _logits(QWEN, adapter=True)[0]
    assert not torch.equal(bits(base), bits(lora_logits))
    assert torch.equal(bits(again), bits(lora_logits))


def test_request_alone_equals_its_rows_in_a_batch(lora_logits) -> None:
    """Batch invariance holds with the adapter path: the first 9 tokens alone = their rows."""
    _, kp, rp = policies(QWEN, 1, None, {}, {})
    _, ids, (arch, weights) = _logits(QWEN, adapter=True)
    alone = ReferenceModel(arch, weights, kp, rp).forward(
        ids[:9], [KVCache()], [9], all_logits=True
    )
    assert torch.equal(bits(alone), bits(lora_logits[:9]))


def _unobservable(contract: str) -> set[str]:
    from contractgen.codegen.vendored import load_target

    notes = load_target("sglang").schema.CONTRACT_DATA[contract]["unobservable"]
    return {k.removeprefix("kernel_policy.") for k in notes}


@pytest.mark.parametrize("field", LORA_FIELDS)
def test_every_lora_field_flipped_changes_the_bits(field: str, lora_logits) -> None:
    """Each lora_* field is load-bearing on the rollout: its fault value (the gate's
    ``--inject-faults`` flip) moves some logit's bits, or the contract explains why not
    (``unobservable``) and the flip shows under float32 accumulation instead. alpha 12 at rank
    8: a scale of 1.5, so where and in which dtype it is applied is visible."""
    _, kp, _ = policies(QWEN, 1, None, {}, {})
    change = {field: flipped(field, getattr(kp, field), "kernel")}
    if field in _unobservable(QWEN):
        wide = {"matmul_accumulation_dtype": "float32"}
        before = _logits(QWEN, adapter=True, kernel_changes=wide)[0]
        moved = _logits(QWEN, adapter=True, kernel_changes=wide | change)[0]
        assert not torch.equal(bits(moved), bits(before)), change
        return
    moved = _logits(QWEN, adapter=True, kernel_changes=change)[0]
    assert not torch.equal(bits(moved), bits(lora_logits)), change


def test_only_the_low_rank_dtype_is_explained() -> None:
    lora_notes = {f for f in _unobservable(QWEN) if f.startswith("lora_")}
    assert lora_notes == {"lora_low_rank_dtype"}
    assert {f for f in _unobservable(LLAMA) if f.startswith("lora_")} == lora_notes


def test_rollout_agrees_with_peft_in_float32() -> None:
    """The rollout at float32 equals peft over transformers' model within 1e-5 (logprobs)."""
    from contractgen.codegen.vendored import load_target
    from contractgen.parity.reference import hf_logprobs, hf_model

    logits, ids, (arch, weights) = _logits(LLAMA, adapter=True, dtype="float32")
    ours = torch.log_softmax(logits.float(), -1)[:-1].gather(-1, ids[1:, None])[:, 0]
    profile = load_target("sglang").schema.model_profile_for(LLAMA)
    with torch.no_grad():
        theirs = hf_logprobs(hf_model(weights, profile, torch.float32), [ids.tolist()])[0]
        base = hf_logprobs(hf_model(random_weights(arch, 0), profile, torch.float32),
                           [ids.tolist()])[0]  # fmt: skip
    assert float((ours - theirs).abs().max()) <= 1e-5
    assert float((ours - base).abs().max()) > 1e-2  # the adapter is visible


def test_check_adapter_names_a_shape_mismatch() -> None:
    arch, _ = model_arch(QWEN, {})
    adapter = random_adapter(arch, MODULES, 8, 16.0)
    name = "model.layers.0.self_attn.q_proj.lora_A.weight"
    adapter[name] = torch.zeros(8, 7)
    with pytest.raises(ValueError, match=r"lora_A\.weight \(8, 7\) / lora_B .* do not fit"):
        check_adapter(arch, adapter, MODULES)


@pytest.mark.parametrize(
    ("contract", "lora", "message"),
    [
        (QWEN, "0", "error: --lora '0': rank must be at least 1 (got 0)"),
        (QWEN, "8,0", "error: --lora '8,0': alpha must be greater than 0 (got 0)"),
        (QWEN, "8,-2", "error: --lora '8,-2': alpha must be greater than 0 (got -2)"),
        (QWEN, "x", "error: --lora 'x': expected RANK[,ALPHA], e.g. 8 or 8,16"),
        (QWEN, "128", f"error: --lora '128': rank 128 exceeds {QWEN}'s lora.max_rank 64"),
        (
            "qwen3_dense_true_on_policy_v2",
            "8",
            "error: --lora: qwen3_dense_true_on_policy_v2 has no lora section (LoRA contracts: "
            f"{LLAMA}, {QWEN})",
        ),
    ],
)
def test_bad_lora_input_is_one_line_exit_2(contract: str, lora: str, message: str) -> None:
    result = CliRunner().invoke(main, ["parity", "--contract", contract, "--lora", lora])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [message]


@pytest.mark.slow
def test_gate_with_lora_is_exact_at_tp1_tp2(tmp_path) -> None:
    """End to end: both sides with the adapter, exact at tp1 and tp2, peft reference within
    tolerance."""
    report = tmp_path / "r.json"
    done = subprocess.run(
        [sys.executable, "-m", "contractgen", "parity", "--contract", LLAMA, "--lora", "8",
         "--layouts", "tp1,tp2", "--rollout-tps", "1", "--json", str(report), "--quiet"],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    import json

    data = json.loads(report.read_text())
    assert all(lay["exact"] for lay in data["layouts"]), data["layouts"]


def test_merged_serving_is_not_a_contract_value() -> None:
    """The schema admits only unmerged serving: merged is another numerics id."""
    from pydantic import ValidationError

    from contractgen.codegen.vendored import load_target

    data = load_target("sglang").schema.CONTRACT_DATA[QWEN]
    merged = {**data, "kernel_policy": {**data["kernel_policy"], "lora_serving": "merged"}}
    with pytest.raises(ValidationError, match="lora_serving"):
        Contract.model_validate(merged, strict=False)
    assert dataclasses.is_dataclass(policies(QWEN, 1, None, {}, {})[1])


def test_peft_export_round_trip(tmp_path) -> None:
    """The exported folder loads with ``PeftModel.from_pretrained`` over transformers' model
    and agrees with the rollout in float32 (<= 1e-5); the key names are PEFT's."""
    import json

    from peft import PeftModel
    from safetensors.torch import load_file

    from contractgen.adapters.common.lora import export_peft, split_adapter
    from contractgen.codegen.vendored import load_target
    from contractgen.parity.reference import hf_logprobs, hf_model

    logits, ids, (arch, weights) = _logits(QWEN, adapter=True, dtype="float32")
    base, adapter = split_adapter(weights)
    export_peft(adapter, tmp_path / "adapter", base_model=arch.name)
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (
        8,
        12.0,
        sorted(MODULES),
    )
    keys = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys
    profile = load_target("sglang").schema.model_profile_for(QWEN)
    loaded = PeftModel.from_pretrained(hf_model(base, profile, torch.float32), tmp_path / "adapter")
    ours = torch.log_softmax(logits.float(), -1)[:-1].gather(-1, ids[1:, None])[:, 0]
    with torch.no_grad():
        theirs = hf_logprobs(loaded.eval(), [ids.tolist()])[0]
    assert float((ours - theirs).abs().max()) <= 1e-5
