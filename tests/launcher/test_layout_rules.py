"""Layout validation, table-driven over valid and invalid layouts for every shipped contract."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from contractgen.adapters.common.layout import padded_vocab
from contractgen.adapters.launcher.layout import (
    Layout,
    LayoutError,
    UnknownModelError,
    subject_for,
    validate_layout,
    violations,
)
from contractgen.adapters.launcher.tp_rules import KV_HEAD_RULES
from contractgen.codegen.vendored import load_target

# the cases below name Qwen3 checkpoints; Llama 3 layouts: test_llama3_layouts.py
# The Qwen3 dense contracts with SGLang's tile order (v1, v2): one set of layout rules. v3's
# fixed runs split 4B's K at TP=8 too, and its reference model is another: its own tests below.
CONTRACT_IDS = tuple(
    cid
    for cid in load_target("launcher").schema.CONTRACT_IDS
    if load_target("launcher").schema.model_profile_for(cid).family == "qwen3_dense"
    and load_target("launcher").schema.kernel_policy_for(cid).matmul_tile_order
    == "sglang_first_level"
)

# (model, layout) pairs every shipped contract allows.
VALID = [
    ("Qwen3-0.6B", Layout()),
    ("Qwen3-0.6B", Layout(tp=2, dp=4)),
    ("Qwen3-0.6B", Layout(tp=8, rollout_tp=8)),
    ("Qwen3-0.6B", Layout(tp=2, pp=4, cp=2, dp=2, world=32)),
    ("Qwen3-0.6B", Layout(cp=4)),
    ("Qwen3-1.7B", Layout(tp=4, pp=2, rollout_tp=2, rollout_dp=4)),
    ("Qwen3-4B", Layout(tp=4, pp=2)),
    ("Qwen3-4B-Instruct-2507", Layout(tp=2, cp=2, rollout_tp=4, rollout_dp=2)),
    ("Qwen3-8B", Layout(tp=8, cp=1, dp=2)),
    ("Qwen3-14B", Layout(tp=8, pp=4)),
    ("Qwen3-32B", Layout(tp=8, pp=4, cp=1)),
    ("Qwen3-32B", Layout(tp=8, cp=4)),  # 1 KV head per TP rank, replicated to the 4 CP ranks
    ("reference", Layout(tp=2, cp=2)),
    ("reference", Layout(tp=2, rollout_tp=2)),
    ("reference", Layout(cp=2, pp=4)),
    ("qwen3-tiny-random", Layout(tp=1, pp=2, cp=2, dp=2)),
]

# (model, layout, [(flag, start of the problem)]) every shipped contract rejects.
INVALID = [
    ("Qwen3-4B", Layout(tp=8), [
        ("--tp", "not in Qwen3-4B's tp_sizes [1, 2, 4]"),
        ("--tp", "splits down_proj K=9728 (76 tiles of 128 in 4 first-level runs of 19"),
        ("--rollout-tp", "not in Qwen3-4B's tp_sizes [1, 2, 4]"),
        ("--rollout-tp", "splits down_proj K=9728"),
    ]),
    ("Qwen3-0.6B", Layout(tp=3, rollout_tp=1), [
        ("--tp", "not in the contract's parallel.training.tp [1, 2, 4, 8]"),
        ("--tp", "does not divide num_attention_heads 16"),
        ("--tp", "does not divide num_kv_heads 8"),
        ("--tp", "splits o_proj K=2048"),
    ]),
    ("Qwen3-0.6B", Layout(pp=3), [
        ("--pp", "not in the contract's parallel.training.pp [1, 2, 4]"),
        ("--pp", "does not divide num_layers 28"),
    ]),
    ("Qwen3-0.6B", Layout(cp=8), [("--cp", "not in the contract's parallel.training.cp.sizes")]),
    ("reference", Layout(tp=4, cp=4, rollout_tp=1), [
        ("--cp", "does not divide the 2 num_attention_heads per TP rank (8/TP 4)"),
    ]),
    ("Qwen3-0.6B", Layout(tp=2, dp=2, world=8), [("--dp", "world 8 != TP 2 x PP 1 x CP 1 x DP 2 = 4")]),
    ("Qwen3-0.6B", Layout(rollout_tp=16), [
        ("--rollout-tp", "not in the contract's parallel.rollout.tp [1, 2, 4, 8]"),
        ("--rollout-tp", "does not divide num_kv_heads 8"),
        ("--rollout-tp", "splits down_proj K=3072 (24 tiles of 128 in 8 first-level runs of 3"),
    ]),
    ("Qwen3-14B", Layout(tp=1, rollout_tp=16), [
        ("--rollout-tp", "not in the contract's parallel.rollout.tp"),
        ("--rollout-tp", "does not divide num_attention_heads 40"),
        ("--rollout-tp", "does not divide num_kv_heads 8"),
        ("--rollout-tp", "splits o_proj K=5120"),
    ]),
]  # fmt: skip


@pytest.mark.parametrize("contract_id", CONTRACT_IDS)
@pytest.mark.parametrize(("model", "layout"), VALID, ids=lambda v: str(v))
def test_valid_layouts(contract_id: str, model: str, layout: Layout) -> None:
    subject = validate_layout(contract_id, layout, model)
    assert subject.layout == layout


@pytest.mark.parametrize("contract_id", CONTRACT_IDS)
@pytest.mark.parametrize(("model", "layout", "expected"), INVALID, ids=lambda v: str(v)[:40])
def test_invalid_layouts(
    contract_id: str, model: str, layout: Layout, expected: list[tuple[str, str]]
) -> None:
    with pytest.raises(LayoutError) as info:
        validate_layout(contract_id, layout, model)
    got = [(v.flag, v.problem) for v in info.value.violations]
    assert len(got) == len(expected), got
    for (flag, problem), (want_flag, want_start) in zip(got, expected, strict=True):
        assert flag == want_flag
        assert problem.startswith(want_start), problem


@pytest.mark.parametrize("contract_id", CONTRACT_IDS)
def test_error_wording_tp8_on_4b(contract_id: str) -> None:
    with pytest.raises(LayoutError) as info:
        validate_layout(contract_id, Layout(tp=8, rollout_tp=4), "Qwen3-4B")
    assert str(info.value) == (
        f"invalid layout for {contract_id} on Qwen3-4B:\n"
        "  --tp 8: not in Qwen3-4B's tp_sizes [1, 2, 4]; valid --tp here: 1, 2, 4 (nearest: --tp 4)\n"
        "  --tp 8: splits down_proj K=9728 (76 tiles of 128 in 4 first-level runs of 19, "
        "sglang_first_level order) into 76/8 tiles per rank, not a whole subtree of the tile "
        "order; valid --tp here: 1, 2, 4 (nearest: --tp 4)"
    )


@pytest.mark.parametrize("contract_id", CONTRACT_IDS)
def test_error_wording_nearest_both_sides(contract_id: str) -> None:
    with pytest.raises(LayoutError) as info:
        validate_layout(contract_id, Layout(tp=1, pp=3), "Qwen3-0.6B")
    assert str(info.value.violations[0]) == (
        "--pp 3: not in the contract's parallel.training.pp [1, 2, 4]; "
        "valid --pp here: 1, 2, 4 (nearest: --pp 2 or --pp 4)"
    )


@pytest.mark.parametrize("contract_id", CONTRACT_IDS)
def test_error_wording_world_names_the_dp_that_fits(contract_id: str) -> None:
    with pytest.raises(LayoutError) as info:
        validate_layout(contract_id, Layout(tp=2, dp=2, world=8))
    assert str(info.value.violations[-1]) == (
        "--dp 2: world 8 != TP 2 x PP 1 x CP 1 x DP 2 = 4; valid --dp here: 4 (nearest: --dp 4)"
    )


@pytest.mark.parametrize("contract_id", CONTRACT_IDS)
def test_error_wording_ulysses(contract_id: str) -> None:
    with pytest.raises(LayoutError) as info:
        validate_layout(contract_id, Layout(tp=4, cp=4, rollout_tp=1), "reference")
    assert str(info.value.violations[0]) == (
        "--cp 4: does not divide the 2 num_attention_heads per TP rank (8/TP 4) that the Ulysses "
        "all-to-all spreads over CP ranks; valid --cp here: 1, 2 (nearest: --cp 2)"
    )


@pytest.mark.parametrize("contract_id", CONTRACT_IDS)
def test_smallest_layout_is_valid_for_every_checkpoint(contract_id: str, schema) -> None:
    profile = schema.model_profile_for(contract_id)
    for dims in (*profile.checkpoints, profile.reference_model):
        validate_layout(contract_id, Layout(), dims.name)


@pytest.mark.parametrize("contract_id", CONTRACT_IDS)
def test_every_allowed_size_passes_or_names_a_model_reason(contract_id: str, schema) -> None:
    """An allowed TP size is only ever refused for a reason of the checkpoint, never 'not allowed'."""
    support = schema.parallel_support_for(contract_id)
    for dims in schema.model_profile_for(contract_id).checkpoints:
        for tp in support.train_tp_sizes:
            found = violations(subject_for(contract_id, Layout(tp=tp), dims.name))
            assert not [v for v in found if "parallel.training.tp" in v.problem]


def test_model_selection(schema) -> None:
    cid = CONTRACT_IDS[0]
    profile = schema.model_profile_for(cid)
    assert subject_for(cid, Layout()).dims == profile.checkpoints[0]
    assert subject_for(cid, Layout(), "reference").dims == profile.reference_model
    with pytest.raises(UnknownModelError) as info:
        subject_for(cid, Layout(), "Qwen3-7B")
    assert str(info.value).startswith(
        f"--model 'Qwen3-7B': not a checkpoint of the qwen3_dense profile of {cid}; known: Qwen3-0.6B,"
    )
    assert str(info.value).endswith(", reference")


def test_unknown_contract_lists_the_known(schema) -> None:
    with pytest.raises(KeyError) as info:
        validate_layout("qwen3_dense_true_on_policy_v9", Layout())
    assert "known: " + ", ".join(load_target("launcher").schema.CONTRACT_IDS) in str(info.value)


# Rules the shipped contracts do not exercise, checked on a contract with its support replaced.


def _subject(layout: Layout, model: str | None = None, **support: object):
    subject = subject_for(CONTRACT_IDS[0], layout, model)
    return replace(subject, support=replace(subject.support, **support))


def test_dp_not_allowed() -> None:
    found = violations(_subject(Layout(dp=2, rollout_dp=2), train_dp=False, rollout_dp=False))
    assert [str(v) for v in found] == [
        "--dp 2: the contract does not allow data parallelism here (parallel.training.dp: false); "
        "valid --dp here: 1 (nearest: --dp 1)",
        "--rollout-dp 2: the contract does not allow data parallelism here (parallel.rollout.dp: "
        "false); valid --rollout-dp here: 1 (nearest: --rollout-dp 1)",
    ]


def test_kv_heads_replicate_rule() -> None:
    # reference: 8 heads, 4 KV heads. TP 8 > KV 4: 'divide' refuses, 'replicate' copies each head.
    big = (1, 2, 4, 8)
    divide = violations(_subject(Layout(tp=8, rollout_tp=1), "reference", train_tp_sizes=big))
    assert any("parallel.kv_heads 'divide'" in v.problem for v in divide)
    replicate = violations(
        _subject(Layout(tp=8, rollout_tp=1), "reference", train_tp_sizes=big, kv_heads="replicate")
    )
    assert not any("kv_heads" in v.problem for v in replicate)
    assert KV_HEAD_RULES["replicate"](8, 3) is not None
    unknown = violations(_subject(Layout(tp=2), kv_heads="mystery"))
    assert (
        "parallel.kv_heads 'mystery' has no rule here (known: divide, replicate)"
        in unknown[0].problem
    )


def test_ulysses_kv_heads_split_or_replicated() -> None:
    subject = _subject(Layout(tp=2, cp=2), "Qwen3-0.6B")
    six_kv = replace(subject, dims=replace(subject.dims, num_kv_heads=6))  # 3 per TP rank
    assert [v.problem for v in violations(six_kv) if v.flag == "--cp"] == [
        "neither divides nor is a multiple of the 3 num_kv_heads per TP rank (6/TP 2): Ulysses "
        "splits KV heads over CP ranks or replicates them"
    ]


def test_unknown_cp_kind() -> None:
    found = violations(_subject(Layout(cp=2), train_cp_kind="ring"))
    assert [v.problem for v in found] == [
        "parallel.training.cp.kind 'ring' has no rules here (known: ulysses)"
    ]
    assert not violations(_subject(Layout(cp=1), train_cp_kind="ring"))


@pytest.mark.parametrize(
    ("vocab", "tp", "padded"),
    [(151936, 1, 151936), (151936, 2, 152064), (151936, 8, 152576), (1000, 2, 1024)],
)
def test_vocab_padding_rule(vocab: int, tp: int, padded: int) -> None:
    assert padded_vocab(vocab, tp, 128) == padded
    assert padded % tp == 0 and (padded // tp) % 128 == 0


def test_the_launcher_tile_rule_is_the_tree_proof() -> None:
    """One rule: the launcher refuses a TP split exactly when the tile-order tree proof (which
    contract validation runs) does, for both orders and K sizes up to 200 tiles."""
    from types import SimpleNamespace

    from contractgen.adapters.launcher.tp_rules import _tile_split
    from contractgen.adapters.tile_order import split_problem

    for order in ("sglang_first_level", "binary"):
        kernel = SimpleNamespace(matmul_k_block=128, matmul_tile_order=order)
        for k in [*(128 * t for t in range(1, 201)), 96, 200, 3000]:
            for tp in (2, 3, 4, 8):
                launcher = _tile_split("down_proj", k, tp, kernel)
                assert (launcher is None) == (split_problem(k, 128, tp, order) is None), (k, tp)


V3 = "qwen3_dense_true_on_policy_v3"


def test_v3_fixed_runs_split_qwen3_4b_at_tp8() -> None:
    """9728 = 8 runs of 1216: each of 8 ranks holds one whole run (v1's 76 tiles of 128 do not
    split into 8 whole subtrees: test_error_wording_tp8_on_4b)."""
    validate_layout(V3, Layout(tp=8, rollout_tp=8), "Qwen3-4B")
    validate_layout(V3, Layout(tp=4, pp=2, rollout_tp=8), "Qwen3-4B")


def test_fixed_runs_split_message_names_runs_and_tiles() -> None:
    from contractgen.adapters.launcher.tp_rules import _tile_split

    kernel = SimpleNamespace(matmul_k_block=64, matmul_tile_order="fixed_runs", matmul_k_runs=8)
    assert _tile_split("down_proj", 4096, 4, kernel) is None
    why = _tile_split("down_proj", 1000 * 8, 2, kernel)
    assert why == (
        "cannot split down_proj exactly: K=8000 does not split into 8 runs of whole 64-wide "
        "tiles (K/8=1000, needs a multiple of 64)"
    )
    kernel4 = SimpleNamespace(matmul_k_block=64, matmul_tile_order="fixed_runs", matmul_k_runs=4)
    assert "TP=8 does not divide the 4 runs" in _tile_split("o_proj", 4096, 8, kernel4)
