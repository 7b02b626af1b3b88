"""Whole-model bitwise parity: megatron-core forward (spawned gloo processes) == SGLang rollout.

One spawn per layout runs several variants (``trainer_logprobs_runs``): the contract itself,
packing variants, and twins with one flipped policy field that must break exactness.
"""

from __future__ import annotations

import pytest
import torch

from contractgen.adapters.megatron.trainer import (
    TrainerFault,
    TrainerRun,
    TrainerSession,
    trainer_logprobs_runs,
)

V1 = "qwen3_dense_true_on_policy_v1"

pytestmark = pytest.mark.slow


def _exact(got, want) -> bool:
    return len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def _forward_exact(result, rollout_logprobs, rollout_layers) -> bool:
    """Logprobs AND every layer's residual stream equal the rollout's (bf16 logprobs alone can
    hide a one-ulp change deep in the model; the forward is what must be bit-identical)."""
    layers_equal = all(
        torch.equal(dump[f"layer.{i}"], value)
        for dump, per_seq in zip(result.layer_dumps, rollout_layers, strict=True)
        for i, value in enumerate(per_seq)
    )
    return layers_equal and _exact(result.logprobs, rollout_logprobs)


def _rt(**changes) -> TrainerRun:
    return TrainerRun(fault=TrainerFault(runtime_policy=changes), dump_layers=True)


def _kp(**changes) -> TrainerRun:
    return TrainerRun(fault=TrainerFault(kernel_policy=changes), dump_layers=True)


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
    "logsoftmax_dtype": _kp(logsoftmax_dtype="float32"),
    "norm_cast_before_weight": _kp(norm_cast_before_weight=False),
    "rope_dtype": _kp(rope_dtype="bfloat16"),
    "matmul_k_block": _kp(matmul_k_block=64),
}


# A residual stream wider than the dense dtype (on both sides): the casts that are no-ops under
# v1/v2 (bf16 everywhere) become visible, and megatron's bias-dropout-add (which casts the residual
# to the output's dtype) no longer matches SGLang's separately carried residual.
WIDE_RESIDUAL = {"residual_dtype": "float32"}
WIDE_RESIDUAL_TWINS = {
    "contract": {},
    "cast_attention_input_to_dense_math_dtype": {"cast_attention_input_to_dense_math_dtype": False},
    "cast_lm_head_input_to_weight_dtype": {"cast_lm_head_input_to_weight_dtype": False},
    "use_sglang_residual_pair": {"use_sglang_residual_pair": False},
}


@pytest.fixture(scope="module")
def tp1(arch, weights, sequences):
    prompt_lens = (5, 5, 5)
    tree_seqs = [sequences[0][:5] + s for s in (sequences[1], sequences[2][:20])]
    tree_seqs.append(sequences[0])
    fp32_kv_twin = TrainerRun(
        dtype_override="float32",
        fault=TrainerFault(kernel_policy={"attention_kv_chunk": 48}),
        dump_layers=True,
    )
    runs = [
        TrainerRun(),
        TrainerRun(dump_layers=True),
        *TP1_TWINS.values(),
        TrainerRun(dtype_override="float32", dump_layers=True),
        fp32_kv_twin,
    ]
    # One session (one spawn) serves every run and both sequence sets.
    with TrainerSession(V1, weights, (1, 1, 1), arch=arch) as session:
        results = [session.logprobs(sequences, run) for run in runs]
        tree = [
            session.logprobs(tree_seqs, TrainerRun()),
            session.logprobs(tree_seqs, TrainerRun(prefix_tree=True, prompt_lens=prompt_lens)),
        ]
        with pytest.raises(RuntimeError, match="has no field"):
            session.logprobs(sequences, _rt(no_such_field=True))
        results.append(session.logprobs(sequences, TrainerRun()))  # still alive after an error
        wide = {
            name: session.logprobs(
                sequences,
                TrainerRun(
                    dump_layers=True,
                    fault=TrainerFault(kernel_policy=WIDE_RESIDUAL, runtime_policy=change),
                ),
            )
            for name, change in WIDE_RESIDUAL_TWINS.items()
        }
    return results, tree, tree_seqs, wide


def test_model_is_megatron_core_gpt_model(arch):
    """Built in-process at TP=1: the trainer model is megatron-core's own GPTModel."""
    from megatron.core.models.gpt import GPTModel
    from megatron_testing import single_process_megatron

    from contractgen.adapters.megatron.model import Layout, build_model, make_config

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
    results, *_ = tp1
    assert _exact(results[0].logprobs, rollout_logprobs)
    assert _exact(results[-1].logprobs, rollout_logprobs)  # the session survived a failed run


def test_tp1_layer_dumps_match_rollout(tp1, arch, weights, sequences):
    from megatron_reference import rollout_layer_outputs

    results, *_ = tp1
    dumps = results[1].layer_dumps
    for i, seq in enumerate(sequences):
        want = rollout_layer_outputs(V1, arch, weights, seq)
        for layer, value in enumerate(want):
            assert torch.equal(dumps[i][f"layer.{layer}"], value), (i, layer)


@pytest.fixture(scope="module")
def rollout_layers(arch, weights, sequences):
    from megatron_reference import rollout_layer_outputs

    return [rollout_layer_outputs(V1, arch, weights, s) for s in sequences]


@pytest.mark.parametrize("name", sorted(TP1_TWINS))
def test_tp1_twin_breaks_exactness(tp1, rollout_logprobs, rollout_layers, name):
    results, *_ = tp1
    assert _forward_exact(results[1], rollout_logprobs, rollout_layers)
    index = 2 + list(TP1_TWINS).index(name)
    assert not _forward_exact(results[index], rollout_logprobs, rollout_layers), name


def test_tp1_float32_diagnostic_mode_exact_and_kv_chunk_twin(tp1, arch, weights, sequences):
    """--dtype float32: every contract dtype float32 on both sides; still exact. In float32 a
    different KV chunk (split-KV tiling) is visible; in bf16 it is mostly rounded away."""
    from megatron_reference import rollout_layer_outputs, rollout_rescore

    from contractgen.adapters.common.policy import float32_kernel_policy
    from contractgen.adapters.megatron.policy import generated

    kp32 = float32_kernel_policy(generated().schema.kernel_policy_for(V1))
    want_lp = rollout_rescore(V1, arch, weights, sequences, kp=kp32)
    want_layers = [rollout_layer_outputs(V1, arch, weights, s, kp=kp32) for s in sequences]
    results, *_ = tp1
    exact32, kv_twin = results[-3], results[-2]
    assert exact32.logprobs[0].dtype == torch.float32
    assert _forward_exact(exact32, want_lp, want_layers)
    assert not _forward_exact(kv_twin, want_lp, want_layers)


@pytest.mark.parametrize("name", sorted(WIDE_RESIDUAL_TWINS))
def test_wide_residual_makes_cast_fields_load_bearing(tp1, arch, weights, sequences, name):
    import dataclasses

    from megatron_reference import rollout_layer_outputs, rollout_rescore

    from contractgen.adapters.megatron.policy import generated

    kp = dataclasses.replace(generated().schema.kernel_policy_for(V1), **WIDE_RESIDUAL)
    want_lp = rollout_rescore(V1, arch, weights, sequences, kp=kp)
    want_layers = [rollout_layer_outputs(V1, arch, weights, s, kp=kp) for s in sequences]
    *_, wide = tp1
    exact = _forward_exact(wide[name], want_lp, want_layers)
    assert exact == (name == "contract"), name


def test_prefix_tree_packing_equals_flat_packing_and_rollout(tp1, arch, weights):
    from megatron_reference import rollout_rescore

    _, tree, tree_seqs, _ = tp1
    flat, packed_tree = tree
    assert _exact(packed_tree.logprobs, flat.logprobs)
    assert _exact(flat.logprobs, rollout_rescore(V1, arch, weights, tree_seqs))


@pytest.mark.parametrize(
    ("layout", "twin"),
    [
        ((1, 2, 1), _rt(use_sglang_final_norm=False)),
        ((1, 1, 2), _rt(cast_qk_after_rope_to_dense_math_dtype=False)),
    ],
    ids=["pp2", "cp2"],
)
def test_parallel_layout_exact(
    arch, weights, sequences, rollout_logprobs, rollout_layers, layout, twin
):
    runs = [TrainerRun(dump_layers=True), twin]
    if layout[2] > 1:  # the all-gather CP layout computes the same per-query function
        runs.append(_rt(cp_layout=None))
    with TrainerSession(V1, weights, layout, arch=arch) as session:
        exact, broken, *other = [session.logprobs(sequences, run) for run in runs]
        # 79 tokens: odd, so under CP the row is padded (the padding gets its own path).
        odd = session.logprobs(sequences[:2])
    assert _forward_exact(exact, rollout_logprobs, rollout_layers)
    assert not _forward_exact(broken, rollout_logprobs, rollout_layers)
    for same in other:
        assert _forward_exact(same, rollout_logprobs, rollout_layers)
    assert _exact(odd.logprobs, rollout_logprobs[:2])


def test_tp2_exact(arch, weights, sequences, rollout_logprobs, rollout_layers):
    """TP=2: fused QKV / gate-up / vocab shards, SGLang row-parallel tree, vocab-parallel
    log-softmax. (A tile-order or all-reduce fault is invisible here: each rank holds 3 K tiles of
    down_proj, where SGLang's run and a binary tree coincide, and two-rank sums commute.)"""
    exact, broken = trainer_logprobs_runs(
        V1,
        weights,
        sequences,
        (2, 1, 1),
        [TrainerRun(dump_layers=True), _rt(cast_qk_norm_input_before_weight_mul=False)],
        arch=arch,
    )
    assert _forward_exact(exact, rollout_logprobs, rollout_layers)
    assert not _forward_exact(broken, rollout_logprobs, rollout_layers)


def test_tied_embeddings_pp2_exact(arch, sequences):
    """Tied input/output embeddings: at PP=2 the LM head lives on the last stage as megatron's
    shared-embedding copy; still exact."""
    import dataclasses

    from megatron_reference import rollout_rescore, weights_for

    tied = dataclasses.replace(arch, tie_word_embeddings=True)
    weights = weights_for(tied, seed=5)
    assert "lm_head.weight" not in weights
    (res,) = trainer_logprobs_runs(V1, weights, sequences, (1, 2, 1), [TrainerRun()], arch=tied)
    assert _exact(res.logprobs, rollout_rescore(V1, tied, weights, sequences))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("layout", [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2)])
def test_cuda_layout_exact_vs_cuda_rollout(arch, weights, sequences, layout):
    """device='cuda' (NCCL, one GPU per rank): the same modules, exact against the rollout's
    reference model on CUDA (checked on 2x H200: TP1, TP2, PP2, CP2 all exact)."""
    from megatron_reference import rollout_rescore

    if torch.cuda.device_count() < layout[0] * layout[1] * layout[2]:
        pytest.skip("not enough GPUs")
    want = rollout_rescore(V1, arch, {k: v.cuda() for k, v in weights.items()}, sequences)
    (res,) = trainer_logprobs_runs(
        V1, weights, sequences, layout, [TrainerRun()], device="cuda", arch=arch
    )
    assert _exact(res.logprobs, [w.cpu() for w in want])


def test_tp2pp2_exact(arch, weights, sequences, rollout_logprobs, rollout_layers):
    """Four ranks: TP=2 inside each of two pipeline stages."""
    (res,) = trainer_logprobs_runs(
        V1, weights, sequences, (2, 2, 1), [TrainerRun(dump_layers=True)], arch=arch
    )
    assert _forward_exact(res, rollout_logprobs, rollout_layers)


def test_v2_contract_float32_logprobs_exact(arch, weights, sequences):
    """qwen3_dense_true_on_policy_v2 (fp32 log-softmax): exact, and the logprobs are float32."""
    from megatron_reference import V2, rollout_rescore

    (res,) = trainer_logprobs_runs(V2, weights, sequences, (1, 1, 1), [TrainerRun()], arch=arch)
    assert res.logprobs[0].dtype == torch.float32
    assert _exact(res.logprobs, rollout_rescore(V2, arch, weights, sequences))
