"""The trainer's MoE block (issue 13): megatron-core's own ``MoELayer`` tree built from our spec,
equal bit for bit to the rollout's ``kernels.moe.moe_block`` (with the rollout's TP=1 ops), and
reading every MoE kernel-policy field: each flipped on the trainer's layer alone makes it differ
from the rollout. Fields whose effect is float32 ulps (top-k normalisation, combine order) are
shown with every dtype float32, where they do not round away; the tie-break on a router whose
logits tie."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from megatron_testing import single_process_megatron

from contractgen.adapters.common.policy import float32_kernel_policy
from contractgen.adapters.kernels import moe as moe_kernels
from contractgen.adapters.megatron.model import Layout, make_config
from contractgen.adapters.megatron.policy import generated
from contractgen.adapters.megatron.provider import SGLangSpecProvider, _moe_spec
from contractgen.adapters.sglang.model import ACTIVATIONS, ModelArch
from contractgen.adapters.sglang.ops import resolve_ops
from contractgen.codegen.vendored import load_target

MOE = "qwen3_moe_true_on_policy_v1"


@pytest.fixture(scope="module", autouse=True)
def megatron_world():
    with single_process_megatron():
        yield


@pytest.fixture(scope="module")
def arch():
    return ModelArch.from_profile(generated().schema.model_profile_for(MOE))


def _kp():
    return generated().schema.kernel_policy_for(MOE)


def _rand(*shape, seed, scale):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)


def _weights(arch, seed=0):
    H, E, F = arch.hidden_size, arch.num_experts, arch.moe_intermediate_size
    router = _rand(E, H, seed=seed, scale=H**-0.5)
    experts = [
        (
            _rand(F, H, seed=seed + 3 * e + 1, scale=H**-0.5),
            _rand(F, H, seed=seed + 3 * e + 2, scale=H**-0.5),
            _rand(H, F, seed=seed + 3 * e + 3, scale=F**-0.5),
        )
        for e in range(E)
    ]
    return router, experts


def _tied_router(arch):
    """With an all-ones input: expert 3 first, 0 second, 1 third, then 2 and 5 exactly tied for
    the fourth (last) place of top-4; the rest negative."""
    H, E = arch.hidden_size, arch.num_experts
    value = dict.fromkeys(range(E), -1.0) | {3: 2.0, 0: 1.5, 1: 1.25, 2: 1.0, 5: 1.0}
    return torch.stack([torch.full((H,), value[e] / H) for e in range(E)]).to(torch.bfloat16)


def trainer_moe_layer(arch, kp, router, experts):
    """The MoE layer the trainer builds for an MoE decoder layer, weights loaded (TP=1)."""
    from megatron.core.transformer.spec_utils import build_module

    config = make_config(MOE, arch, Layout(), kernel_policy=kp)
    layer = build_module(_moe_spec(config, SGLangSpecProvider()), config=config)
    with torch.no_grad():
        layer.router.weight.copy_(router)
        for mlp, (gate, up, down) in zip(layer.experts.local_experts, experts, strict=True):
            mlp.linear_fc1.weight.copy_(torch.cat([gate, up]))
            mlp.linear_fc2.weight.copy_(down)
    return layer.eval()


def rollout_moe_block(arch, kp, x, router, experts):
    """What the rollout's ``ReferenceModel._moe_mlp`` computes before its residual add (TP=1)."""
    rp = load_target("sglang").runtime_policy.policy_for(MOE, SimpleNamespace(tp_size=1))
    ops = resolve_ops(kp, rp, 1)
    return moe_kernels.moe_block(
        x,
        router,
        experts,
        kp,
        top_k=arch.num_experts_per_tok,
        normalize=bool(arch.norm_topk_prob),
        act=ACTIVATIONS[arch.activation],
        column_linear=ops.column_linear,
        row_partial=ops.row_partial,
        all_reduce=ops.mlp_all_reduce,
    )


def _run(layer, x):
    out, bias = layer(x[:, None, :])
    assert bias is None
    return out[:, 0]


def test_the_moe_layer_is_megatron_cores_tree(arch):
    from megatron.core.transformer.mlp import MLP
    from megatron.core.transformer.moe.experts import SequentialMLP
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.moe.router import TopKRouter

    layer = trainer_moe_layer(arch, _kp(), *_weights(arch))
    assert isinstance(layer, MoELayer) and isinstance(layer.router, TopKRouter)
    assert isinstance(layer.experts, SequentialMLP)
    assert all(type(m) is MLP for m in layer.experts.local_experts)
    names = set(layer.state_dict())
    assert "router.weight" in names
    for e in range(arch.num_experts):
        assert f"experts.local_experts.{e}.linear_fc1.weight" in names
        assert f"experts.local_experts.{e}.linear_fc2.weight" in names


@pytest.mark.parametrize("dtypes", ["contract", "float32"])
def test_moe_layer_equals_the_rollout_block(arch, dtypes):
    kp = _kp() if dtypes == "contract" else float32_kernel_policy(_kp())
    router, experts = _weights(arch)
    x = _rand(24, arch.hidden_size, seed=99, scale=1.0)
    layer = trainer_moe_layer(arch, kp, router, experts)
    expected = rollout_moe_block(
        arch, kp, x.to(getattr(torch, kp.dense_math_dtype)), router, experts
    )
    assert torch.equal(_run(layer, x), expected)


def test_tied_router_logits_are_broken_as_the_rollout_breaks_them(arch):
    kp = _kp()
    router, experts = _tied_router(arch), _weights(arch)[1]
    x = torch.ones(3, arch.hidden_size, dtype=torch.bfloat16)
    layer = trainer_moe_layer(arch, kp, router, experts)
    _, ids = layer.router.route_topk(x)
    assert ids.tolist() == [[3, 0, 1, 2]] * 3  # lowest id of the tied pair (2, 5)
    assert torch.equal(_run(layer, x), rollout_moe_block(arch, kp, x, router, experts))


FLIPS = {
    # field: (flipped value, dtypes of the check, tied router)
    "moe_router_logits_dtype": ("float32", "contract", False),
    "moe_topk_tie_break": ("highest_expert_id", "contract", True),
    "moe_topk_normalisation": ("softmax_over_topk_logits", "float32", False),
    "moe_combine_order": ("topk_rank", "float32", False),
}


@pytest.mark.parametrize("field", sorted(FLIPS))
def test_each_moe_field_flipped_on_the_trainer_alone_breaks_equality(arch, field):
    value, dtypes, tied = FLIPS[field]
    kp = _kp() if dtypes == "contract" else float32_kernel_policy(_kp())
    assert getattr(kp, field) != value
    router, experts = _weights(arch)
    x = _rand(24, arch.hidden_size, seed=99, scale=1.0).to(getattr(torch, kp.dense_math_dtype))
    if tied:
        router, x = _tied_router(arch), torch.ones(3, arch.hidden_size, dtype=torch.bfloat16)
    rollout = rollout_moe_block(arch, kp, x, router, experts)
    same = trainer_moe_layer(arch, kp, router, experts)
    flipped = trainer_moe_layer(arch, dataclasses.replace(kp, **{field: value}), router, experts)
    assert torch.equal(_run(same, x), rollout)
    assert not torch.equal(_run(flipped, x), rollout)


def _float64_moe(x, router, experts, top_k):
    """Qwen3-MoE's block in float64, plainly: softmax over all experts, top-k, weights divided by
    their sum, each expert's SwiGLU FFN, weighted sum (the function, not the contract's order)."""
    probs = torch.softmax(x @ router.T, dim=-1)
    w, ids = torch.topk(probs, top_k, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for e, (gate, up, down) in enumerate(experts):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        h = x[tok]
        y = (torch.nn.functional.silu(h @ gate.T) * (h @ up.T)) @ down.T
        out = out.index_add(0, tok, w[tok, slot, None] * y)
    return out


def test_moe_layer_gradients_match_float64_autograd(arch):
    """Backward through the trainer's MoE layer (kernel forward, megatron's linear backward, the
    kernels' own autograd for softmax and combine), every dtype float32: the gradients of the
    input, the router and every expert's weights within the gate's ``--grads`` tolerance
    (``1e-4`` relative) of float64 autograd through the plain block."""
    kp = float32_kernel_policy(_kp())
    router, experts = _weights(arch)
    layer = trainer_moe_layer(arch, kp, router, experts).train()
    for p in layer.parameters():
        p.data = p.data.float()
    x = _rand(24, arch.hidden_size, seed=99, scale=1.0).float().requires_grad_()
    g = _rand(24, arch.hidden_size, seed=7, scale=1.0).double()
    (_run(layer, x).double() * g).sum().backward()

    x64 = x.detach().double().requires_grad_()
    r64 = router.double().requires_grad_()
    e64 = [tuple(t.double().requires_grad_() for t in ex) for ex in experts]
    (_float64_moe(x64, r64, e64, arch.num_experts_per_tok) * g).sum().backward()

    pairs = [(x.grad, x64.grad), (layer.router.weight.grad, r64.grad)]
    for mlp, (gate, up, down) in zip(layer.experts.local_experts, e64, strict=True):
        pairs.append((mlp.linear_fc1.weight.grad, torch.cat([gate.grad, up.grad])))
        pairs.append((mlp.linear_fc2.weight.grad, down.grad))
    for got, want in pairs:
        assert got is not None and got.shape == want.shape
        rel = float((got.double() - want).abs().max() / want.abs().max())
        assert rel <= 1e-4, rel


@pytest.mark.parametrize("tp", [1, 2])
def test_checkpoint_names_round_trip_through_megatron(arch, tp):
    """HF weights -> each TP rank's megatron state dict (router replicated, experts sharded as
    the dense MLP) -> TP shards concatenated along each parameter's partition dim ->
    ``hf_state_from_stage``: every HF tensor back, ``torch.equal``, dense layer 1 included."""
    from contractgen.adapters.megatron.checkpoint import (
        hf_state_from_stage,
        megatron_stage_state_dict,
    )
    from contractgen.adapters.megatron.model import build_model, padded_vocab_size
    from contractgen.adapters.sglang.model import random_weights

    kp = _kp()
    padded = padded_vocab_size(arch, tp, kp)
    config = make_config(MOE, arch, Layout(), kernel_policy=kp)
    model = build_model(
        config, arch, pre_process=True, post_process=True, padded_vocab_size=padded // tp
    )
    params = dict(model.named_parameters())
    assert "decoder.layers.1.mlp.linear_fc1.weight" in params  # mlp_only_layers: [1]
    assert "decoder.layers.2.mlp.router.weight" in params
    hf = random_weights(arch, seed=3)
    ranks = [
        megatron_stage_state_dict(hf, arch, model, tp_rank=r, tp_size=tp, padded_vocab_size=padded)
        for r in range(tp)
    ]
    full = {}
    for name, p in params.items():
        parts = [sd[name] for sd in ranks]
        sharded = getattr(p, "tensor_model_parallel", False)
        full[name] = torch.cat(parts, dim=p.partition_dim) if sharded else parts[0]
        if not sharded:
            assert all(torch.equal(t, parts[0]) for t in parts)
    layers = {i: i for i in range(arch.num_layers)}
    back = hf_state_from_stage(full, arch, layers, tp_size=tp)
    assert set(back) == set(hf)
    assert all(torch.equal(back[name], hf[name]) for name in hf)


@pytest.mark.parametrize("normalize", [True, False])
def test_top1_router_keeps_the_checkpoints_normalisation(arch, normalize):
    """Top-1: megatron-core refuses a router without pre-softmax, so the config says
    ``moe_router_pre_softmax=True`` and carries ``norm_topk_prob`` on its own. The trainer's
    layer still equals the rollout's block both ways (a renormalised single weight is 1, an
    unnormalised one its probability), and the two differ from each other."""
    top1 = dataclasses.replace(arch, num_experts_per_tok=1, norm_topk_prob=normalize)
    kp = float32_kernel_policy(_kp())
    config = make_config(MOE, top1, Layout(), kernel_policy=kp)
    assert config.moe_router_pre_softmax and config.true_on_policy_moe_norm_topk_prob is normalize
    router, experts = _weights(top1)
    x = _rand(24, top1.hidden_size, seed=99, scale=1.0).float()
    got = _run(trainer_moe_layer(top1, kp, router, experts), x)
    assert torch.equal(got, rollout_moe_block(top1, kp, x, router, experts))
    other = dataclasses.replace(top1, norm_topk_prob=not normalize)
    assert not torch.equal(got, rollout_moe_block(other, kp, x, router, experts))
