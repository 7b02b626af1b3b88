"""Issue 13: MoE fields are contract fields a dense contract must not carry and an MoE contract
must carry, each refusal a ``file:line:col: field: message`` line; dense canonical data (and so
the shipped numerics fingerprints) has no MoE keys."""

from __future__ import annotations

import pytest

from contractgen.codegen.fingerprint import contract_fingerprint
from contractgen.schema.errors import ContractError
from contractgen.schema.loader import parse_contract

from .helpers import ROOT

MOE = "contracts/qwen3_moe_true_on_policy_v1.yaml"
DENSE = "contracts/qwen3_dense_true_on_policy_v1.yaml"


def _problems(text: str, file: str) -> list[str]:
    with pytest.raises(ContractError) as info:
        parse_contract(text.encode(), file)
    return [str(p) for p in info.value.problems]


def test_dense_contract_refuses_moe_fields() -> None:
    text = (ROOT / DENSE).read_text()
    text = text.replace(
        "  logsoftmax_vocab_block: 128\n",
        "  logsoftmax_vocab_block: 128\n  moe_combine_order: expert_id\n",
    )
    text = text.replace("tp_sizes: [1, 2, 4]}", "tp_sizes: [1, 2, 4], num_experts: 8}", 1)
    got = _problems(text, DENSE)
    assert any(
        p.endswith("kernel_policy.moe_combine_order: must be absent: qwen3_dense has no "
                   "mixture-of-experts block") for p in got
    ), got  # fmt: skip
    assert any("num_experts: must be absent" in p for p in got), got


def test_moe_contract_needs_every_moe_field() -> None:
    text = (ROOT / MOE).read_text()
    got = _problems(text.replace("  moe_topk_tie_break: lowest_expert_id\n", ""), MOE)
    assert len(got) == 1 and got[0].endswith(
        "kernel_policy.moe_topk_tie_break: required: qwen3_moe has a mixture-of-experts block"
    ), got
    got = _problems(text.replace("num_experts_per_tok: 4,", "num_experts_per_tok: 9,"), MOE)
    assert len(got) == 1 and got[0].endswith(
        "model_profile.reference_model.num_experts_per_tok: must not exceed num_experts (got 9 of 8)"
    ), got
    got = _problems(text.replace("mlp_only_layers: [1],", "mlp_only_layers: [1, 4],"), MOE)
    assert len(got) == 1 and "layers [4] do not exist (num_layers is 4)" in got[0], got


def test_tied_router_experts_are_ascending_distinct_ids() -> None:
    """(Misplaced or missing experts: golden errors/tied_router_experts_misplaced.)"""
    text = (ROOT / MOE).read_text()
    for tied in ("[5, 2]", "[2, 2]", "[2]"):
        got = _problems(text.replace("tied_router_experts: [2, 5]", f"tied_router_experts: {tied}"), MOE)  # fmt: skip
        assert len(got) == 1 and got[0].endswith(
            "model_profile.reference_model.tied_router_experts: must list two or more expert "
            f"ids, ascending, without repeats (got {tied})"
        ), got


def test_expert_down_k_limits_tp() -> None:
    """Expert down_proj K=768 (6 tiles) does not split over TP=4: the checkpoint may not list it."""
    text = (
        (ROOT / MOE)
        .read_text()
        .replace(
            "max_position_embeddings: 40960, tp_sizes: [1, 2],",
            "max_position_embeddings: 40960, tp_sizes: [1, 2, 4],",
        )
    )
    got = _problems(text, MOE)
    assert len(got) == 1 and "checkpoints.0.moe_intermediate_size: K=768" in got[0], got


def test_dense_fingerprints_unchanged_by_the_moe_fields() -> None:
    """The values ``contractgen list`` showed before the MoE fields existed."""
    expected = {
        "llama3_dense_true_on_policy_v1": "sha256:604387c3daf8",
        "qwen3_dense_true_on_policy_v1": "sha256:3fb4b2740cad",
        "qwen3_dense_true_on_policy_v2": "sha256:53daab895352",
    }
    for cid, prefix in expected.items():
        contract = parse_contract((ROOT / f"contracts/{cid}.yaml").read_bytes(), cid)
        data = contract.model_dump(mode="json")
        assert not any(k.startswith("moe_") for k in data["kernel_policy"])
        assert contract_fingerprint(data).startswith(prefix), cid


def test_ep_sizes_belong_to_moe_contracts_and_divide_the_reference_experts() -> None:
    dense = (ROOT / DENSE).read_text()
    got = _problems(
        dense.replace(
            "    sequence_parallel: false\n", "    sequence_parallel: false\n    ep: [1, 2]\n"
        ),
        DENSE,
    )
    assert len(got) == 1 and got[0].endswith(
        "parallel.training.ep: must be absent: qwen3_dense has no mixture-of-experts block to "
        "split over ranks"
    ), got
    moe = (ROOT / MOE).read_text()
    got = _problems(moe.replace("    ep: [1, 2, 4, 8]\n", "    ep: [1, 3, 16]\n"), MOE)
    assert len(got) == 1 and got[0].endswith(
        "parallel.training.ep: sizes [3, 16] do not divide the reference model's num_experts 8 "
        "(each EP rank holds the same number of whole experts)"
    ), got
    got = _problems(moe.replace("  moe_ep_combine: gather_slots\n", ""), MOE)
    assert len(got) == 1 and got[0].endswith(
        "kernel_policy.moe_ep_combine: required: qwen3_moe has a mixture-of-experts block"
    ), got
