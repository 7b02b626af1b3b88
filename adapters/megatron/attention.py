"""Self-attention with SGLang numerics on megatron-core's ``SelfAttention``.

``SGLangSelfAttention`` keeps megatron's fused-QKV projection, per-query-group split and QK-norm,
and only adds the runtime policy's cast of the attention input. The model is built with
``position_embedding_type="none"``, so megatron's CUDA-only rotary embedding and causal-mask paths
never run: ``SGLangCoreAttention`` (the spec's ``core_attention``) does RoPE, causal masking over
packed paths (see ``packing``), Ulysses context parallelism and the attention itself, with
SGLang's kernels. ``KernelAttention`` is an autograd function: its forward saves the output and
the log-sum-exp, its backward is the kernel library's ``attention_backward`` (FlashAttention's
formulas, Triton on CUDA), so training runs no second attention. The stock backends
(``sdpa``/``default``) run a plain differentiable fp32 masked-softmax attention one path at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from megatron.core.models.common.embeddings.rope_utils import _rotate_half
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel.mappings import all_to_all
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.module import MegatronModule
from torch.distributed.nn.functional import all_gather
from torch.utils.checkpoint import checkpoint

from ..kernels.attention import chunked_attention_lse
from ..kernels.attention_meta import attention_backward_known
from ..kernels.linear_attention import sigmoid_gate
from ..kernels.policy import KernelPolicy
from ..kernels.rope import apply_rope, rope_cos_sin
from .layers import ATTENTION_INPUT_CAST
from .packing import SGLangPackedSeqParams
from .policy import dtype_of


class SGLangSelfAttention(SelfAttention):
    """megatron-core ``SelfAttention`` whose QKV input is cast per
    ``cast_attention_input_to_dense_math_dtype``."""

    def __init__(self, config: Any, submodules: Any, layer_number: int, **kwargs: Any) -> None:
        super().__init__(config, submodules, layer_number, **kwargs)
        self.runtime_policy = config.true_on_policy.rp
        self.kernel_policy = config.true_on_policy.kernel
        self._input_cast = ATTENTION_INPUT_CAST[
            bool(self.runtime_policy.cast_attention_input_to_dense_math_dtype)
        ]

    def get_query_key_value_tensors(self, hidden_states, key_value_states=None, **kwargs):
        return super().get_query_key_value_tensors(
            self._input_cast(hidden_states, self.kernel_policy), key_value_states, **kwargs
        )

    def _apply_output_gate(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """megatron's output gate (``attention_output_gate``: ``x * sigmoid(gate)``) by the
        rollout's kernel, in ``kp.gate_dtype``."""
        return sigmoid_gate(x, gate.contiguous().view(*x.shape), self.kernel_policy)


# ---------------------------------------------------------------------------------------------
# Context-parallel layouts: how the sequence-sharded q/k/v reach full sequence.
# ---------------------------------------------------------------------------------------------


def _seq_to_heads(x_LHD: torch.Tensor, group: Any) -> torch.Tensor:
    """Ulysses all-to-all: ``[T/cp, H, D]`` (sequence shard) -> ``[T, H/cp, D]`` (head shard)."""
    cp = group.size()
    t, h, d = x_LHD.shape
    x = x_LHD.reshape(t, cp, h // cp, d).transpose(0, 1).contiguous().reshape(cp * t, h // cp, d)
    return all_to_all(group, x)


def _heads_to_seq(x_THD: torch.Tensor, group: Any) -> torch.Tensor:
    """Inverse of ``_seq_to_heads``: ``[T, H/cp, D]`` -> ``[T/cp, H, D]``."""
    cp = group.size()
    t, h, d = x_THD.shape
    y = all_to_all(group, x_THD.contiguous())  # [cp(head group), T/cp, H/cp, D] flattened
    y = y.reshape(cp, t // cp, h, d).transpose(0, 1).reshape(t // cp, cp * h, d)
    return y


def _gather_seq(x_LHD: torch.Tensor, group: Any) -> torch.Tensor:
    """All-gather CP layout: every rank gets the whole sequence, all heads (differentiable)."""
    if group.size() == 1:
        return x_LHD

    return torch.cat(all_gather(x_LHD.contiguous(), group=group), dim=0)


def _local_seq(x_THD: torch.Tensor, group: Any) -> torch.Tensor:
    """Inverse of ``_gather_seq``: this rank's contiguous sequence shard."""
    n = x_THD.shape[0] // group.size()
    return x_THD[group.rank() * n : (group.rank() + 1) * n]


# cp_layout -> (to full sequence, back to this rank's shard). Without a layout (no contract, or
# CP=1) the all-gather layout runs: at CP=1 both functions are the identity.
CP_LAYOUTS: dict[str | None, tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]] = {
    None: (_gather_seq, _local_seq),
    "ulysses_a2a": (_seq_to_heads, _heads_to_seq),
}


# ---------------------------------------------------------------------------------------------
# RoPE and the q/k cast after it.
# ---------------------------------------------------------------------------------------------


def _rope_then_dense(x: torch.Tensor, cos, sin, kp: KernelPolicy) -> torch.Tensor:
    """SGLang: rotate in ``rope_dtype``, result back in the input (dense) dtype."""
    return apply_rope(x, cos, sin, kp)


def _rope_keep_rope_dtype(x: torch.Tensor, cos, sin, kp: KernelPolicy) -> torch.Tensor:
    """Without the cast: q/k stay in ``rope_dtype`` into attention."""
    return apply_rope(x.to(dtype_of(kp.rope_dtype)), cos, sin, kp)


def _megatron_rope(x: torch.Tensor, cos, sin, kp: KernelPolicy) -> torch.Tensor:
    """megatron-core's unfused rotary (``_apply_rotary_pos_emb_bshd``): cos/sin cast to the input
    dtype and the rotation done there (what runs with rope fusion left to megatron)."""
    c = cos[:, None, :].to(x.dtype)  # kernel cos/sin are [L, head_dim] (neox layout)
    s = sin[:, None, :].to(x.dtype)
    return x * c + _rotate_half(x, False) * s


# disable_rope_fusion -> cast_qk_after_rope_to_dense_math_dtype -> RoPE implementation.
ROPE: dict[bool, dict[bool, Callable[..., torch.Tensor]]] = {
    True: {True: _rope_then_dense, False: _rope_keep_rope_dtype},
    False: {True: _megatron_rope, False: _megatron_rope},
}


# ---------------------------------------------------------------------------------------------
# Attention over packed paths.
# ---------------------------------------------------------------------------------------------


def _kernel_calls(params: SGLangPackedSeqParams):
    """``(query rows, key rows, cu_seqlens, query positions, positions contiguous)`` of each
    kernel call over a pack: one varlen call when the pack is flat (a row's bits depend only on
    its query, position and keys, so this is the per-path result), else one call per path with
    its owned queries against the path's keys gathered into position order, so chunk boundaries
    are the rollout's (absolute 0, 64, ...). Built by the first layer that asks and kept on the
    params (``memoized``): the index tensors, int32 positions and the host-side contiguity flags
    are the microbatch's, so no later layer rebuilds them."""
    return params.memoized("attention_calls", lambda: _build_kernel_calls(params))


def _build_kernel_calls(params: SGLangPackedSeqParams):
    pos = params.positions.to(torch.int32)  # what the kernels read (int32 on the Triton path)
    flags = params.positions_contiguous
    if params.flat:
        host = params.cu_seqlens_host
        contiguous = None if flags is None else all(flags)
        cu = params.cu_seqlens_q if host is None else host
        return [(slice(None), slice(None), cu, pos, contiguous)]
    calls = []
    for i, (path, owned) in enumerate(zip(params.paths, params.owned, strict=True)):
        if owned.numel():
            rows = path[owned]
            calls.append((rows, path, None, pos[rows], None if flags is None else flags[i]))
    return calls


class KernelAttention(torch.autograd.Function):
    """SGLang's chunked attention over a pack; backward from the saved output and log-sum-exp
    (``attention_backward``: no second forward, no dense scores). Rows no path owns get 0.
    A flat pack is one kernel call whose output and log-sum-exp are returned as they come (no
    zero-filled buffer and copy)."""

    @staticmethod
    def forward(ctx, q_THD, k_TKD, v_TKD, params: SGLangPackedSeqParams, kp: KernelPolicy, scale):
        calls = _kernel_calls(params)
        sd = dtype_of(kp.attention_softmax_dtype)
        if len(calls) == 1 and isinstance(calls[0][0], slice):  # one call over the whole pack
            _, _, cu, pos, _ = calls[0]
            out, lse = chunked_attention_lse(
                q_THD, k_TKD, v_TKD, pos, kp, cu_seqlens_q=cu, cu_seqlens_k=cu, scale=scale
            )
            lse = lse.to(sd)
        else:
            out = q_THD.new_zeros(q_THD.shape)
            lse = q_THD.new_zeros(q_THD.shape[:2], dtype=sd)
            for rows, keys, cu, pos, _ in calls:
                o, l_ = chunked_attention_lse(
                    q_THD[rows],
                    k_TKD[keys],
                    v_TKD[keys],
                    pos,
                    kp,
                    cu_seqlens_q=cu,
                    cu_seqlens_k=cu,
                    scale=scale,
                )
                out[rows], lse[rows] = o, l_
        ctx.save_for_backward(q_THD, k_TKD, v_TKD, out, lse)
        ctx.calls, ctx.kp, ctx.scale = calls, kp, scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        backward = attention_backward_known
        grads = [
            (
                rows,
                keys,
                backward(
                    q[rows],
                    k[keys],
                    v[keys],
                    out[rows],
                    lse[rows],
                    d_out[rows],
                    pos,
                    ctx.kp,
                    cu_seqlens_q=cu,
                    cu_seqlens_k=cu,
                    scale=ctx.scale,
                    positions_contiguous=contiguous,
                ),
            )
            for rows, keys, cu, pos, contiguous in ctx.calls
        ]
        if len(grads) == 1 and isinstance(grads[0][0], slice):  # one call over the whole pack
            return (*grads[0][2], None, None, None)
        # paths share prefix rows: sum their key gradients in float32, then round once
        md = torch.promote_types(q.dtype, torch.float32)
        dq, dk, dv = (torch.zeros(t.shape, dtype=md, device=t.device) for t in (q, k, v))
        for rows, keys, (dq_p, dk_p, dv_p) in grads:
            dq.index_add_(0, rows, dq_p.to(md))
            dk.index_add_(0, keys, dk_p.to(md))
            dv.index_add_(0, keys, dv_p.to(md))
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def reference_attention(q_THD, k_TKD, v_TKD, mask_TT, scale) -> torch.Tensor:
    """Differentiable fp32 masked-softmax attention (GQA by repeat): ``mask[i, j]``, query row
    ``i`` may attend key row ``j``."""
    scale = q_THD.shape[-1] ** -0.5 if scale is None else scale
    g = q_THD.shape[1] // k_TKD.shape[1]
    q = q_THD.float()
    k = k_TKD.float().repeat_interleave(g, 1)
    v = v_TKD.float().repeat_interleave(g, 1)
    s = torch.einsum("thd,shd->hts", q, k) * scale
    s = s.masked_fill(~mask_TT[None], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("hts,shd->thd", p, v).to(q_THD.dtype)


def path_reference_attention(q_THD, k_TKD, v_TKD, params: SGLangPackedSeqParams, scale):
    """``reference_attention`` one packed path at a time (a row sees its own path's keys up to
    its position; paths share only prefix rows): ``[rows, path]`` scores per path instead of
    ``[T, T]`` for the whole pack, so the gradient path's memory and work grow with each
    sequence's length squared, not the pack's (32 x 512 packed tokens: 16 MiB of scores a head
    group instead of 16 GiB). Rows outside every path get 0."""
    outs, rows_all = [], []
    for path, owned in zip(params.paths, params.owned, strict=True):
        rows = path[owned]
        if rows.numel() == 0:
            continue
        n = path.numel()
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=path.device))[owned]
        outs.append(reference_attention(q_THD[rows], k_TKD[path], v_TKD[path], causal, scale))
        rows_all.append(rows)
    out = q_THD.new_zeros(q_THD.shape)
    if not outs:
        return out
    return out.index_copy(0, torch.cat(rows_all), torch.cat(outs).to(out.dtype))


def _kernel_attention_backend(q, k, v, params, kp: KernelPolicy, scale):
    return KernelAttention.apply(q, k, v, params, kp, scale)


def _sdpa_backend(q, k, v, params, kp: KernelPolicy, scale):
    """Stock attention (one fused softmax, no fixed KV chunking)."""
    return path_reference_attention(q, k, v, params, scale)


ATTENTION_BACKENDS: dict[str | None, Callable[..., torch.Tensor]] = {
    "fa3_varlen": _kernel_attention_backend,
    "sdpa": _sdpa_backend,
    "default": _sdpa_backend,  # DEFAULT_RUNTIME_POLICY: no contract, Megatron's own attention
    None: _sdpa_backend,
}


class SGLangCoreAttention(MegatronModule):
    """Core attention (megatron ``CoreAttention`` protocol) with SGLang numerics.

    Input q/k/v come from megatron's ``SelfAttention`` after QK-norm, in ``thd`` layout
    (``[T_local, heads, head_dim]``, ``packed_seq_params`` an ``SGLangPackedSeqParams``). Steps:
    CP layout (Ulysses all-to-all to full sequence / head shard), RoPE at global positions,
    the q/k cast, attention per path, CP layout back. Returns ``[T_local, heads * head_dim]``.
    """

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str = "self",
        cp_comm_type: str | None = None,
        softmax_scale: float | None = None,
        pg_collection: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(config=config)
        self.layer_number = layer_number
        self.runtime_policy = config.true_on_policy.rp
        self.kernel_policy = config.true_on_policy.kernel
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp", "cp"])
        self.cp_group = pg_collection.cp
        self.head_dim = config.kv_channels
        # partial RoPE: the first ``rotary_dim`` dims of each head rotate, the rest pass
        self.rotary_dim = int(self.head_dim * config.rotary_percent)
        self.softmax_scale = softmax_scale  # None: the kernel's own head_dim ** -0.5
        self.rope_theta = float(config.rotary_base)
        self.rope_scaling = getattr(config, "true_on_policy_rope_scaling", None)
        self.max_position = int(getattr(config, "true_on_policy_max_position_embeddings", 0))
        self._to_full_seq, self._to_local_seq = CP_LAYOUTS[self.runtime_policy.cp_layout]
        self._rope = ROPE[bool(self.runtime_policy.disable_rope_fusion)][
            bool(self.runtime_policy.cast_qk_after_rope_to_dense_math_dtype)
        ]
        self._attention = ATTENTION_BACKENDS[self.runtime_policy.attention_backend]
        self._recompute = bool(self.runtime_policy.use_ulysses_cp_recompute_fallback)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: SGLangPackedSeqParams | None = None,
    ) -> torch.Tensor:
        if not isinstance(packed_seq_params, SGLangPackedSeqParams):
            raise TypeError(
                "SGLangCoreAttention needs packed_seq_params=SGLangPackedSeqParams "
                "(positions and paths); build one with packing.thd_params(pack_sequences(...))"
            )
        if self._recompute and self.training and torch.is_grad_enabled():
            return checkpoint(
                self._forward, query, key, value, packed_seq_params, use_reentrant=False
            )
        return self._forward(query, key, value, packed_seq_params)

    def _rope_table(
        self, params: SGLangPackedSeqParams, kp: KernelPolicy
    ) -> tuple[torch.Tensor, ...]:
        """``rope_cos_sin`` at the pack's positions, once per microbatch (``memoized``): every
        layer with the same head dim, base, scaling and RoPE dtype reads the same table."""
        key = (
            "rope",
            self.rotary_dim,
            self.rope_theta,
            repr(self.rope_scaling),
            self.max_position,
            kp.rope_dtype,
        )
        return params.memoized(
            key,
            lambda: rope_cos_sin(
                params.positions,
                self.rotary_dim,
                self.rope_theta,
                self.rope_scaling,
                kp,
                max_position=self.max_position,
            ),
        )

    def _rotate(self, x_THD: torch.Tensor, cos, sin, kp: KernelPolicy) -> torch.Tensor:
        """RoPE over each head's first ``rotary_dim`` dims (all of them, or a family's partial
        share: the rest passes unchanged, as the rollout's ``_qk`` does)."""
        if self.rotary_dim == x_THD.shape[-1]:
            return self._rope(x_THD, cos, sin, kp)
        rot = self.rotary_dim
        turned = self._rope(x_THD[..., :rot].contiguous(), cos, sin, kp)
        return torch.cat([turned, x_THD[..., rot:].to(turned.dtype)], dim=-1)

    def _forward(self, query, key, value, params: SGLangPackedSeqParams) -> torch.Tensor:
        kp = self.kernel_policy
        cp = self.cp_group.size() if self._to_full_seq is _seq_to_heads else 1
        if key.shape[1] < cp:  # Ulysses with fewer local KV heads than CP ranks: replicate them
            key = key.repeat_interleave(cp // key.shape[1], dim=1)
            value = value.repeat_interleave(cp // value.shape[1], dim=1)
        q = self._to_full_seq(query, self.cp_group)
        k = self._to_full_seq(key, self.cp_group)
        v = self._to_full_seq(value, self.cp_group)
        cos, sin = self._rope_table(params, kp)
        q = self._rotate(q, cos, sin, kp)
        k = self._rotate(k, cos, sin, kp)
        out = self._attention(q, k, v, params, kp, self.softmax_scale)
        out = out.to(dtype_of(kp.dense_math_dtype))
        out = self._to_local_seq(out, self.cp_group)
        return out.reshape(out.shape[0], -1)
