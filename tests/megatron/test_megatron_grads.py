"""Backward under parallel layouts: Ulysses CP with ``defer_ulysses_cp_loss_scaling_to_grad_sum``
(the gradient scale) and TP (megatron-core's dgrad all-reduce under the straight-through linears),
both against the TP=CP=1 gradient of the same loss."""

from __future__ import annotations

import pytest
import torch

from contractgen.adapters.megatron.trainer import TrainerFault, TrainerRun, trainer_logprobs_runs

V1 = "qwen3_dense_true_on_policy_v1"

pytestmark = pytest.mark.slow

GRADS = TrainerRun(dtype_override="float32", grads=True)


@pytest.fixture(scope="module")
def full_grads(arch, weights, sequences):
    (res,) = trainer_logprobs_runs(V1, weights, sequences, (1, 1, 1), [GRADS], arch=arch)
    return res.grads


def _close(got, want, name):
    assert want.abs().max() > 0, name
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * want.abs().max(), msg=name)


def test_ulysses_cp_gradient_scale(arch, weights, sequences, full_grads):
    """CP=2 ranks each own half the tokens; their gradients summed with the contract's scale
    (cp / dp_cp) equal the CP=1 gradient of the whole loss; megatron's default (1 / dp_cp,
    the field flipped) gives exactly half of it."""
    flipped = TrainerRun(
        dtype_override="float32",
        grads=True,
        fault=TrainerFault(runtime_policy={"defer_ulysses_cp_loss_scaling_to_grad_sum": False}),
    )
    cp2, cp2_flipped = trainer_logprobs_runs(
        V1, weights, sequences, (1, 1, 2), [GRADS, flipped], arch=arch
    )
    names = [n for n in full_grads if "layers.0." in n or "embedding" in n]
    assert len(names) >= 5
    for name in names:
        _close(cp2.grads[name], full_grads[name], name)
        assert torch.equal(cp2_flipped.grads[name] * 2, cp2.grads[name]), name


def test_tensor_parallel_gradients_equal_tp1_shards(arch, weights, sequences, full_grads):
    """TP=2, rank 0: its shard of every weight gradient equals that slice of the TP=1 one;
    norms (replicated) get the full gradient."""
    (tp2,) = trainer_logprobs_runs(V1, weights, sequences, (2, 1, 1), [GRADS], arch=arch)
    g = tp2.grads
    layer = "decoder.layers.0."
    rows = {  # column-parallel: rank 0 holds the first half of the output rows
        "embedding.word_embeddings.weight",
        "output_layer.weight",
        layer + "self_attention.linear_qkv.weight",
    }
    cols = {layer + "self_attention.linear_proj.weight", layer + "mlp.linear_fc2.weight"}
    for name in rows:
        _close(g[name], full_grads[name][: g[name].shape[0]], name)
    for name in cols:
        _close(g[name], full_grads[name][:, : g[name].shape[1]], name)
    half = g[layer + "mlp.linear_fc1.weight"].shape[0] // 2  # [gate shard; up shard]
    fc1 = full_grads[layer + "mlp.linear_fc1.weight"]
    full_half = fc1.shape[0] // 2
    want = torch.cat([fc1[:half], fc1[full_half : full_half + half]])
    _close(g[layer + "mlp.linear_fc1.weight"], want, "linear_fc1")
    for name in (layer + "input_layernorm.weight", layer + "self_attention.q_layernorm.weight"):
        _close(g[name], full_grads[name], name)
