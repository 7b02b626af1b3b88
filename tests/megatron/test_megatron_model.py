"""Whole-model bitwise parity: megatron-core forward (spawned gloo processes) == SGLang rollout.

One spawn per layout runs several variants (``trainer_logprobs_runs``): the contract itself,
packing variants, and twins with one flipped policy field that must break exactness.
"""

from __future__ import annotations

import pytest
import torch

from contractgen.adapters.megatron.trainer import TrainerFault, TrainerRun, trainer_logprobs_runs

V1 = "qwen3_dense_true_on_policy_v1"

pytestmark = pytest.mark.slow


def _exact(got, want) -> bool:
    return len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def _rt(**changes) -> TrainerRun:
    return TrainerRun(fault=TrainerFault(runtime_policy=changes))


def _kp(**changes) -> TrainerRun:
    return TrainerRun(fault=TrainerFault(kernel_policy=changes))


# Twins: each flips ONE field on the trainer side only; the forward must stop being exact.
TP1_TWINS = {
    "cast_qk_norm_input_before_weight_mul": _rt(cast_qk_norm_input_before_weight_mul=False),
    "cast_qk_after_rope_to_dense_math_dtype": _rt(cast_qk_after_rope_to_dense_math_dtype=False),
    "batch_invariant_mode": _rt(batch_invariant_mode=False),
    "disable_bias_swiglu_fusion": _rt(disable_bias_swiglu_fusion=False),
    "disable_rope_fusion": _rt(disable_rope_fusion=False),
    "apply_logits_contract": _rt(apply_logits_contract=False),
    "use_sglang_final_norm": _rt(use_sglang_final_norm=False),
    "attention_backend": _rt(attention_backend="sdpa"),
    "enabled": _rt(enabled=False),
    "matmul_tile_order": _kp(matmul_tile_order="binary"),
    "attention_kv_chunk": _kp(attention_kv_chunk=48),
    "logsoftmax_dtype": _kp(logsoftmax_dtype="float32"),
    "norm_cast_before_weight": _kp(norm_cast_before_weight=False),
    "rope_dtype": _kp(rope_dtype="bfloat16"),
    "matmul_k_block": _kp(matmul_k_block=64),
}


@pytest.fixture(scope="module")
def tp1(arch, weights, sequences):
    prompt_lens = (5, 5, 5)
    tree_seqs = [sequences[0][:5] + s for s in (sequences[1], sequences[2][:20])]
    tree_seqs.append(sequences[0])
    runs = [
        TrainerRun(),
        TrainerRun(dump_layers=True),
        *TP1_TWINS.values(),
    ]
    results = trainer_logprobs_runs(V1, weights, sequences, (1, 1, 1), runs, arch=arch)
    tree = trainer_logprobs_runs(
        V1,
        weights,
        tree_seqs,
        (1, 1, 1),
        [TrainerRun(), TrainerRun(prefix_tree=True, prompt_lens=prompt_lens)],
        arch=arch,
    )
    return results, tree, tree_seqs


def test_model_is_megatron_core_gpt_model(arch):
    """Built in-process at TP=1: the trainer model is megatron-core's own GPTModel."""
    from megatron.core.models.gpt import GPTModel

    from contractgen.adapters.megatron.model import Layout, build_model, make_config
    from contractgen.adapters.megatron.testing import single_process_megatron

    with single_process_megatron():
        config = make_config(V1, arch, Layout())
        model = build_model(
            config, arch, pre_process=True, post_process=True, padded_vocab_size=1024
        )
    assert isinstance(model, GPTModel)
    layer = model.decoder.layers[0]
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.transformer_layer import TransformerLayer

    assert isinstance(layer, TransformerLayer)
    assert isinstance(layer.self_attention.linear_qkv, ColumnParallelLinear)
    assert isinstance(layer.self_attention.linear_proj, RowParallelLinear)
    assert isinstance(model.output_layer, ColumnParallelLinear)


def test_tp1_exact(tp1, rollout_logprobs):
    results, _, _ = tp1
    assert _exact(results[0].logprobs, rollout_logprobs)


def test_tp1_layer_dumps_match_rollout(tp1, arch, weights, sequences):
    from megatron_reference import rollout_layer_outputs

    results, _, _ = tp1
    dumps = results[1].layer_dumps
    for i, seq in enumerate(sequences):
        want = rollout_layer_outputs(V1, arch, weights, seq)
        for layer, value in enumerate(want):
            assert torch.equal(dumps[i][f"layer.{layer}"], value), (i, layer)


@pytest.mark.parametrize("name", sorted(TP1_TWINS))
def test_tp1_twin_breaks_exactness(tp1, rollout_logprobs, name):
    results, _, _ = tp1
    index = 2 + list(TP1_TWINS).index(name)
    assert not _exact(results[index].logprobs, rollout_logprobs), name


def test_prefix_tree_packing_equals_flat_packing_and_rollout(tp1, arch, weights):
    from megatron_reference import rollout_rescore

    _, tree, tree_seqs = tp1
    flat, packed_tree = tree
    assert _exact(packed_tree.logprobs, flat.logprobs)
    assert _exact(flat.logprobs, rollout_rescore(V1, arch, weights, tree_seqs))


@pytest.mark.parametrize(
    ("layout", "twin"),
    [
        ((1, 2, 1), _rt(use_sglang_final_norm=False)),
        ((1, 1, 2), _kp(attention_kv_chunk=48)),
    ],
    ids=["pp2", "cp2"],
)
def test_parallel_layout_exact(arch, weights, sequences, rollout_logprobs, layout, twin):
    exact, broken = trainer_logprobs_runs(
        V1, weights, sequences, layout, [TrainerRun(), twin], arch=arch
    )
    assert _exact(exact.logprobs, rollout_logprobs)
    assert not _exact(broken.logprobs, rollout_logprobs)


def test_tp2_exact(arch, weights, sequences, rollout_logprobs):
    exact, broken = trainer_logprobs_runs(
        V1,
        weights,
        sequences,
        (2, 1, 1),
        [TrainerRun(), _kp(matmul_tile_order="binary")],
        arch=arch,
    )
    assert _exact(exact.logprobs, rollout_logprobs)
    assert not _exact(broken.logprobs, rollout_logprobs)
