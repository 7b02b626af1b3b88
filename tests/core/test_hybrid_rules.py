"""Issue 35: the linear-attention (hybrid) fields are contract fields a non-hybrid contract must not
carry and a Qwen3-Next contract must carry, each refusal a ``file:line:col: field: message``
line; context parallelism over linear-attention layers is refused with one line; the other
contracts' canonical data has no hybrid keys (their fingerprints do not move)."""

from __future__ import annotations

import pytest

from contractgen.adapters.families import family_for
from contractgen.schema.errors import ContractError
from contractgen.schema.loader import parse_contract
from contractgen.schema.models import HYBRID_DIMS_FIELDS, HYBRID_KERNEL_FIELDS

from .helpers import ROOT

NEXT = "contracts/qwen3_next_true_on_policy_v1.yaml"
MOE = "contracts/qwen3_moe_true_on_policy_v1.yaml"


def _problems(text: str, file: str) -> list[str]:
    with pytest.raises(ContractError) as info:
        parse_contract(text.encode(), file)
    return [str(p) for p in info.value.problems]


def test_next_contract_loads_and_other_contracts_carry_no_hybrid_keys() -> None:
    contract = parse_contract((ROOT / NEXT).read_bytes(), NEXT)
    data = contract.model_dump(mode="json")
    assert all(data["kernel_policy"][f] is not None for f in HYBRID_KERNEL_FIELDS)
    for path in sorted((ROOT / "contracts").glob("*.yaml")):
        if path.name == NEXT.split("/")[-1]:
            continue
        other = parse_contract(path.read_bytes(), str(path)).model_dump(mode="json")
        assert not set(HYBRID_KERNEL_FIELDS) & set(other["kernel_policy"]), path.name
        dims = other["model_profile"]["reference_model"]
        assert not set(HYBRID_DIMS_FIELDS) & set(dims), path.name


def test_next_contract_needs_every_hybrid_field() -> None:
    text = (ROOT / NEXT).read_text()
    got = _problems(text.replace("  delta_rule_solve: row_substitution\n", ""), NEXT)
    assert len(got) == 1 and got[0].endswith(
        "kernel_policy.delta_rule_solve: required: qwen3_next has linear-attention layers"
    ), got
    got = _problems(text.replace("linear_conv_kernel_dim: 4, full_attention_interval: 2", "full_attention_interval: 2"), NEXT)  # fmt: skip
    assert len(got) == 1 and got[0].endswith(
        "model_profile.reference_model.linear_conv_kernel_dim: required: qwen3_next has "
        "linear-attention layers"
    ), got
    got = _problems(text.replace("kind: zero_centred_rmsnorm", "kind: rmsnorm"), NEXT)
    assert len(got) == 1 and got[0].endswith(
        "model_profile.norm.kind: must be zero_centred_rmsnorm for qwen3_next"
    ), got


def test_moe_contract_refuses_hybrid_fields() -> None:
    text = (ROOT / MOE).read_text()
    text = text.replace("  moe_combine_dtype: float32\n", "  moe_combine_dtype: float32\n  conv_dtype: float32\n")  # fmt: skip
    got = _problems(text, MOE)
    assert any(
        p.endswith("kernel_policy.conv_dtype: must be absent: qwen3_moe has no linear-attention layers")
        for p in got
    ), got  # fmt: skip


def test_context_parallelism_over_linear_attention_is_refused() -> None:
    text = (ROOT / NEXT).read_text().replace("cp: {kind: ulysses, sizes: [1]}", "cp: {kind: ulysses, sizes: [1, 2]}")  # fmt: skip
    got = _problems(text, NEXT)
    assert len(got) == 1 and got[0].endswith(
        "parallel.training.cp.sizes: must be [1]: context parallelism over qwen3_next's "
        "linear-attention layers is not built (their recurrent state would have to pass "
        "between CP ranks)"
    ), got
    assert ":8" in got[0].split(": parallel")[0] or NEXT in got[0]


def test_tp_must_split_whole_key_head_groups() -> None:
    text = (ROOT / NEXT).read_text().replace("linear_num_key_heads: 2,", "linear_num_key_heads: 1,")
    text = text.replace("linear_num_value_heads: 4,", "linear_num_value_heads: 2,")
    got = _problems(text, NEXT)
    assert any(
        "linear_num_key_heads: TP=2 must divide linear_num_key_heads (got 1" in p for p in got
    ), got


def test_family_weights_follow_each_layer_mixer() -> None:
    """Released dims: 48 layers, every fourth full attention; the out_proj K (value heads x
    128 = 4096) is a row-parallel K the tile rules check."""
    contract = parse_contract((ROOT / NEXT).read_bytes(), NEXT)
    (dims,) = contract.model_profile.checkpoints
    family = family_for("qwen3_next")
    mixers = [family.mixer(dims, i) for i in range(dims.num_layers)]
    assert mixers.count("full_attention") == 12 and mixers[3] == "full_attention"
    shapes = family.weight_shapes(dims, qk_norm=True)
    assert shapes["model.layers.0.linear_attn.in_proj_qkvz.weight"] == (2 * 2048 + 2 * 4096, 2048)
    assert shapes["model.layers.3.self_attn.q_proj.weight"] == (2 * 16 * 256, 2048)
    assert "model.layers.3.linear_attn.out_proj.weight" not in shapes
    assert "model.layers.0.mlp.experts.511.down_proj.weight" in shapes
    assert ("out_proj", "linear_num_value_heads", 4096) in family.row_parallel(dims)
