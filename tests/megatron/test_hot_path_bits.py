"""The trainer's hot path without per-layer host work gives the bits it gave before (issue 32).

What changed: the pack's attention calls, int32 positions and RoPE table are built once per
microbatch and kept on the params (``SGLangPackedSeqParams.memoized``) instead of by every
layer; a flat pack's attention returns the kernel's output and log-sum-exp as they come instead
of copying them into zero-filled buffers; the params reach the device in one copy
(``SGLangPackedSeqParams.to``); the backward is told the pack's positions are contiguous. The
old path is kept here verbatim (``_LegacyKernelAttention``, ``_legacy_rope_table``: the code of
``adapters/megatron/attention.py`` before) and both run the same tiny model (v1 and v3, a flat
pack and a prefix tree): logprobs and every gradient must have the same bit patterns. The twin
runs the old path with the RoPE table rounded to bf16, and the comparison must see it.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from host_sync_probe import same_bits
from megatron_reference import random_sequences, tiny_arch, weights_for
from megatron_testing import single_process_megatron

from contractgen.adapters import kernels
from contractgen.adapters.common.packing import pack_sequences
from contractgen.adapters.megatron import attention as attn_mod
from contractgen.adapters.megatron.checkpoint import load_into
from contractgen.adapters.megatron.model import Layout, build_model, make_config, padded_vocab_size
from contractgen.adapters.megatron.packing import SGLangPackedSeqParams, thd_params
from contractgen.adapters.megatron.policy import dtype_of, generated

V1 = "qwen3_dense_true_on_policy_v1"
V3 = "qwen3_dense_true_on_policy_v3"


# ------------------------------------------------------- the old path, verbatim (before issue 32)


def _legacy_kernel_calls(params: SGLangPackedSeqParams):
    if params.flat:
        host = params.cu_seqlens_host
        return [(slice(None), slice(None), params.cu_seqlens_q if host is None else host)]
    return [
        (path[owned], path, None)
        for path, owned in zip(params.paths, params.owned, strict=True)
        if owned.numel()
    ]


LEGACY_CALLS = {"forward": 0, "backward": 0}  # the old path ran (not the new one twice)


class _LegacyKernelAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q_THD, k_TKD, v_TKD, params, kp, scale):
        LEGACY_CALLS["forward"] += 1
        attn = kernels.attention
        out = q_THD.new_zeros(q_THD.shape)
        lse = q_THD.new_zeros(q_THD.shape[:2], dtype=dtype_of(kp.attention_softmax_dtype))
        calls = _legacy_kernel_calls(params)
        for rows, keys, cu in calls:
            o, l_ = attn.chunked_attention_lse(
                q_THD[rows], k_TKD[keys], v_TKD[keys], params.positions[rows], kp,
                cu_seqlens_q=cu, cu_seqlens_k=cu, scale=scale,
            )  # fmt: skip
            out[rows], lse[rows] = o, l_
        ctx.save_for_backward(q_THD, k_TKD, v_TKD, out, lse)
        ctx.calls, ctx.positions, ctx.kp, ctx.scale = calls, params.positions, kp, scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        LEGACY_CALLS["backward"] += 1
        q, k, v, out, lse = ctx.saved_tensors
        backward = kernels.attention.attention_backward
        grads = [
            (rows, keys, backward(
                q[rows], k[keys], v[keys], out[rows], lse[rows], d_out[rows], ctx.positions[rows],
                ctx.kp, cu_seqlens_q=cu, cu_seqlens_k=cu, scale=ctx.scale,
            ))
            for rows, keys, cu in ctx.calls
        ]  # fmt: skip
        if len(grads) == 1 and isinstance(grads[0][0], slice):
            return (*grads[0][2], None, None, None)
        md = torch.promote_types(q.dtype, torch.float32)
        dq, dk, dv = (torch.zeros(t.shape, dtype=md, device=t.device) for t in (q, k, v))
        for rows, keys, (dq_p, dk_p, dv_p) in grads:
            dq.index_add_(0, rows, dq_p.to(md))
            dk.index_add_(0, keys, dk_p.to(md))
            dv.index_add_(0, keys, dv_p.to(md))
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def _legacy_rope_table(self, params, kp):
    """Every layer computes the table again (the old ``_forward``'s call)."""
    return kernels.rope.rope_cos_sin(
        params.positions, self.head_dim, self.rope_theta, self.rope_scaling, kp,
        max_position=self.max_position,
    )  # fmt: skip


def _legacy_rope_table_bf16(self, params, kp):
    """The twin: the old table rounded to bf16 (a change the comparison must see)."""
    cos, sin = _legacy_rope_table(self, params, kp)
    return cos.to(torch.bfloat16).to(cos.dtype), sin.to(torch.bfloat16).to(sin.dtype)


# --------------------------------------------------------------------------------- the runs


@pytest.fixture(scope="module", autouse=True)
def megatron_world():
    with single_process_megatron():
        yield


def _pack(tree: bool):
    seqs = random_sequences((70, 9, 33), 1000, seed=1)
    if not tree:
        return pack_sequences(seqs)
    # two responses to each prompt: the prompt's rows are stored once and feed both paths
    seqs = [s[:6] + r for s in seqs for r in (s[6:], s[6:][::-1][:5])]
    return pack_sequences(seqs, prompt_lens=[6] * len(seqs), prefix_tree=True)


def _run(contract: str, pack, params) -> dict:
    arch = tiny_arch(contract, num_layers=2)
    kp = generated().schema.kernel_policy_for(contract)
    padded = padded_vocab_size(arch, 1, kp)
    torch.manual_seed(0)
    model = build_model(make_config(contract, arch, Layout()), arch, pre_process=True,
                        post_process=True, padded_vocab_size=padded)  # fmt: skip
    load_into(model, weights_for(arch, seed=0), arch, tp_rank=0, tp_size=1,
              padded_vocab_size=padded)  # fmt: skip
    model.train()
    logits = model(input_ids=pack.token_ids[None], position_ids=pack.positions[None],
                   attention_mask=None, packed_seq_params=params)  # fmt: skip
    targets = torch.roll(pack.token_ids, -1)
    lp = kernels.logsoftmax.vocab_parallel_token_logprobs(
        logits[0], targets, 0, arch.vocab_size, kp
    )
    (-lp.float().sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {"logprobs": lp.detach(), "grads": grads}


def _legacy(monkeypatch, rope=_legacy_rope_table):
    monkeypatch.setattr(attn_mod, "KernelAttention", _LegacyKernelAttention)
    monkeypatch.setattr(attn_mod.SGLangCoreAttention, "_rope_table", rope)


@pytest.mark.parametrize("tree", [False, True], ids=["flat", "prefix-tree"])
@pytest.mark.parametrize("contract", [V1, V3])
def test_hot_path_keeps_the_old_bits(contract, tree, monkeypatch):
    pack = _pack(tree)
    assert thd_params(pack).flat is not tree
    new = _run(contract, pack, thd_params(pack).to("cpu"))
    before = dict(LEGACY_CALLS)
    with monkeypatch.context() as m:
        _legacy(m)
        old = _run(contract, pack, thd_params(pack))
    assert all(LEGACY_CALLS[k] == before[k] + 2 for k in LEGACY_CALLS)  # two layers, old path
    assert new["grads"] and same_bits(new, old)


@pytest.mark.parametrize("contract", [V1, V3])
def test_hot_path_bits_twin_sees_a_rope_change(contract, monkeypatch):
    pack = _pack(False)
    new = _run(contract, pack, thd_params(pack).to("cpu"))
    with monkeypatch.context() as m:
        _legacy(m, rope=_legacy_rope_table_bf16)
        twin = _run(contract, pack, thd_params(pack))
    assert not same_bits(new, twin)


def test_params_keep_what_layers_derive_once_per_microbatch():
    """The second layer reads the first layer's attention calls and RoPE table (the same
    objects); a copy (``to``, ``dataclasses.replace``) starts empty; the one host-to-device copy
    keeps every index."""
    pack = _pack(True)
    params = thd_params(pack)
    calls = attn_mod._kernel_calls(params)
    assert attn_mod._kernel_calls(params) is calls
    assert all(c[4] is True for c in calls)  # every path's owned positions run p0, p0 + 1, ...
    moved = params.to("cpu")
    assert moved.memo == {} and dataclasses.replace(params).memo == {}
    for a, b in zip([params.positions, *params.paths, *params.owned],
                    [moved.positions, *moved.paths, *moved.owned], strict=True):  # fmt: skip
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert moved.cu_seqlens_kv is moved.cu_seqlens_q


def test_planted_backward_bug_still_reaches_the_trainer_attention():
    """The parity gate plants ``attention_dk_scale_dropped`` by replacing
    ``attention.attention_backward`` on the module; the trainer's backward (now through
    ``attention_meta``) must still run the replacement: dK comes back divided by the scale."""
    from contractgen.adapters.common.policy import float32_kernel_policy
    from contractgen.adapters.kernels.planted import planted

    kp = float32_kernel_policy(generated().schema.kernel_policy_for(V1))
    params = thd_params(_pack(False))
    t = params.positions.numel()
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(t, h, 64, generator=g) for h in (8, 4, 4))

    def dk():
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        attn_mod.KernelAttention.apply(*leaves, params, kp, None).square().sum().backward()
        return leaves[1].grad

    clean = dk()
    with planted(["attention_dk_scale_dropped"]):
        bugged = dk()
    torch.testing.assert_close(bugged * 64**-0.5, clean, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(bugged, clean)
