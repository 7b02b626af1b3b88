"""The contract's ops as transformers modules: what ``model.attach`` puts into an HF model.

Why module replacement (and not a dispatch mode such as ``TorchDispatchMode``): the contract is
about *which* op runs with *which* casts, not about intercepting ``aten`` calls. A dispatch mode
sees ``aten.mm`` with no idea whether it is a row-parallel linear (partial in the accumulation
dtype, one rounding after the reduce) or the LM head (input cast to ``lm_head_input_dtype``),
and HF's own casts (``hidden_states.to(input_dtype)`` in RMSNorm, the bf16 ``q * cos`` of its
RoPE) would still run. Replacing the modules keeps transformers' model class, its decoder
layers, its residual adds and its state-dict names, and puts each contract op at the one place
its cast order is defined. The modules take over the HF module's parameters (same names, same
tensors), so FSDP shards them and the state dict is the checkpoint's.

transformers' extension points used:

* attention: ``AttentionInterface.register(ATTENTION_NAME, chunked_attention_forward)``; the
  model's ``config._attn_implementation`` names it (the runtime policy's
  ``attn_implementation``). A name transformers' mask registry does not know gets no mask
  (packed sequences are described by ``cu_seq_lens_q``/``cu_seq_lens_k`` and ``position_ids``,
  the kwargs transformers passes through to the attention function for varlen kernels).
* everything else by module replacement: embedding, RMSNorm (layer, QK and final), rotary
  embedding (the contract's cos/sin table), the attention block (QK-norm, then the contract's
  RoPE in ``rope_dtype``, then the registered attention function: HF's ``apply_rotary_pos_emb``
  is a module-level function, not an extension point), linears (column: the invariant matmul;
  row: the partial in the accumulation dtype, one cast), the MLP (``silu_glu``), the MoE block
  (``kernels.moe.moe_block``) and the LM head.

Training: each kernel's forward value with a differentiable stock twin's gradient
(``straight_through``) where the kernel has no backward of its own; attention has its own
(``attention_backward`` from the saved log-sum-exp); RMSNorm and the log-softmax are autograd
functions in the kernel library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..kernels import attention as attn_kernels
from ..kernels._dtypes import dtype_of
from ..kernels.all_reduce import all_reduce_for
from ..kernels.matmul import invariant_matmul, shard_policy
from ..kernels.mlp import silu_glu
from ..kernels.moe import moe_block
from ..kernels.norm import rms_norm
from ..kernels.policy import KernelPolicy
from ..kernels.rope import apply_rope, rope_cos_sin

# The name the contract's attention is registered under (the contracts' ``attn_implementation``).
ATTENTION_NAME = "true_on_policy_chunked"


def needs_grad(*tensors: torch.Tensor | None) -> bool:
    """True when autograd would record an op on any of ``tensors``."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def straight_through(value: Callable[[], torch.Tensor], stock: Callable[[], torch.Tensor]):
    """``value()``'s bits with ``stock()``'s gradient: ``v + (s - s.detach())`` adds exactly +0
    to every finite element, so the forward bits are the kernel's and autograd differentiates
    the stock op. Without a gradient to compute, only ``value()`` runs."""
    with torch.no_grad():
        v = value()
    s = stock()
    if not s.requires_grad:
        return v
    return v + (s - s.detach())


# ---- linears ---------------------------------------------------------------------------------
def column_linear(x: torch.Tensor, w: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    """``x @ w.T`` by the invariant matmul, output in ``x``'s dtype (the rollout's column op)."""
    if not needs_grad(x, w):
        return invariant_matmul(x, w, kp)
    return straight_through(lambda: invariant_matmul(x, w, kp), lambda: F.linear(x, w))


def row_linear(x: torch.Tensor, w: torch.Tensor, kp: KernelPolicy, group: Any) -> torch.Tensor:
    """The rollout's row-parallel op at one rank: the tile tree in the accumulation dtype, the
    kernel policy's all-reduce over ``group`` (this rank alone: an FSDP trainer has no TP, the
    tree is whole here), then one cast to ``x``'s dtype."""

    def value() -> torch.Tensor:
        acc = dtype_of(kp.matmul_accumulation_dtype)
        partial = invariant_matmul(x, w, shard_policy(kp, 1), out_dtype=acc)
        return all_reduce_for(kp)(partial, group).to(x.dtype)

    if not needs_grad(x, w):
        return value()
    return straight_through(value, lambda: F.linear(x, w))


class ContractLinear(nn.Module):
    """An HF ``nn.Linear`` (no bias) computed by the contract: ``row`` for the row-parallel
    linears of the family (``o_proj``, ``down_proj``), column otherwise. Holds the HF module's
    ``weight`` parameter (same name, same tensor)."""

    def __init__(self, weight: nn.Parameter, kp: KernelPolicy, row: bool, group: Any) -> None:
        super().__init__()
        self.weight = weight
        self.kp, self.row, self.group = kp, row, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.row:
            return row_linear(x, self.weight, self.kp, self.group)
        return column_linear(x, self.weight, self.kp)


class ContractLMHead(nn.Module):
    """The LM head: final hidden state and weight cast to ``kp.lm_head_input_dtype``, invariant
    matmul (logits in that dtype, as the rollout's)."""

    def __init__(self, weight: nn.Parameter, kp: KernelPolicy) -> None:
        super().__init__()
        self.weight, self.kp = weight, kp

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        lm = dtype_of(self.kp.lm_head_input_dtype)
        x, w = h.to(lm), self.weight.to(lm)
        if not needs_grad(x, w):
            return invariant_matmul(x, w, self.kp)
        return straight_through(lambda: invariant_matmul(x, w, self.kp), lambda: F.linear(x, w))


class ContractEmbedding(nn.Module):
    """Token embedding in the parameters' (gathered) dtype, then cast to ``kp.residual_dtype``:
    the residual stream starts as the rollout's does."""

    def __init__(self, weight: nn.Parameter, kp: KernelPolicy) -> None:
        super().__init__()
        self.weight, self.kp = weight, kp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight).to(dtype_of(self.kp.residual_dtype))


def _keep(x: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    return x


def _to_dense(x: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    return x.to(dtype_of(kp.dense_math_dtype))


# where a norm's output goes: into a dense matmul (the decoder layers' norms: rounded to the
# dense dtype, as the rollout's ``rms_norm(h, …).to(dense)``), or on in its input's dtype (the
# QK-norms, whose input is dense already; the final norm, which the LM head casts itself)
NORM_OUTPUTS: dict[str, Callable[[torch.Tensor, Any], torch.Tensor]] = {
    "dense": _to_dense,
    "keep": _keep,
}


class ContractRMSNorm(nn.Module):
    """``kernels.norm.rms_norm`` over the last dim with the HF module's ``weight``."""

    def __init__(self, weight: nn.Parameter, eps: float, kp: KernelPolicy, output: str) -> None:
        super().__init__()
        self.weight, self.eps, self.kp = weight, eps, kp
        self.output = NORM_OUTPUTS[output]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(rms_norm(x, self.weight, self.eps, self.kp), self.kp)


class ContractRotary(nn.Module):
    """Replaces the model's ``rotary_emb``: the contract's ``(cos_LD, sin_LD)`` in
    ``kp.rope_dtype`` for the packed row's positions (``rope_cos_sin``; the model's RoPE
    scaling), handed by the HF model to every attention block as ``position_embeddings``."""

    def __init__(
        self, head_dim: int, theta: float, scaling: Any, max_position: int, kp: KernelPolicy
    ):
        super().__init__()
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        self.max_position, self.kp = max_position, kp

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        return rope_cos_sin(
            position_ids[0],
            self.head_dim,
            self.theta,
            self.scaling,
            self.kp,
            max_position=self.max_position,
        )


# ---- attention -------------------------------------------------------------------------------
class _ChunkedAttention(torch.autograd.Function):
    """The contract's attention over a pack; backward from the saved output and log-sum-exp."""

    @staticmethod
    def forward(ctx, q_LHD, k_LKD, v_LKD, positions, cu, kp: KernelPolicy, scale):
        out, lse = attn_kernels.chunked_attention_lse(
            q_LHD, k_LKD, v_LKD, positions, kp, cu_seqlens_q=cu, cu_seqlens_k=cu, scale=scale
        )
        ctx.save_for_backward(q_LHD, k_LKD, v_LKD, out, lse, positions, cu)
        ctx.kp, ctx.scale = kp, scale
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse, positions, cu = ctx.saved_tensors
        dq, dk, dv = attn_kernels.attention_backward(
            q,
            k,
            v,
            out,
            lse,
            d_out.contiguous(),
            positions,
            ctx.kp,
            cu_seqlens_q=cu,
            cu_seqlens_k=cu,
            scale=ctx.scale,
        )
        return dq, dk, dv, None, None, None, None


def chunked_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature (``[1, heads, T, D]`` in, ``[1, T, heads, D]``
    out) around ``kernels.attention``: causal per packed sequence (``cu_seq_lens_q``), fixed KV
    chunks at absolute positions (``position_ids``), GQA by the kernel. Registered as
    ``ATTENTION_NAME``."""
    q = query[0].transpose(0, 1)
    k, v = key[0].transpose(0, 1), value[0].transpose(0, 1)
    positions, cu = kwargs["position_ids"][0], kwargs["cu_seq_lens_q"]
    kp = module.kp
    if needs_grad(q, k, v):
        out = _ChunkedAttention.apply(q, k, v, positions, cu, kp, scaling)
    else:
        out = attn_kernels.chunked_attention(
            q, k, v, positions, kp, cu_seqlens_q=cu, cu_seqlens_k=cu, scale=scaling
        )
    return out[None], None


def register_attention() -> None:
    """Register ``chunked_attention_forward`` in transformers' ``AttentionInterface`` (global,
    idempotent)."""
    AttentionInterface.register(ATTENTION_NAME, chunked_attention_forward)


class ContractAttention(nn.Module):
    """An HF attention block (``Qwen3Attention``, ``LlamaAttention``, ``Qwen3MoeAttention``)
    with the contract's order: q/k/v projections, per-head QK-norm (when the model has it),
    the contract's RoPE in ``kp.rope_dtype`` rounded back, then the attention function the
    config names (``ALL_ATTENTION_FUNCTIONS``), then ``o_proj``. Keeps the HF block's child
    modules under their names."""

    def __init__(self, hf: nn.Module, kp: KernelPolicy) -> None:
        super().__init__()
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, name, getattr(hf, name))
        self.q_norm = getattr(hf, "q_norm", None)
        self.k_norm = getattr(hf, "k_norm", None)
        self.config, self.layer_idx = hf.config, hf.layer_idx
        self.head_dim, self.scaling = hf.head_dim, hf.scaling
        self.num_key_value_groups = hf.num_key_value_groups
        self.attention_dropout, self.is_causal = 0.0, True
        self.kp = kp

    def _heads(self, proj: nn.Module, norm: nn.Module | None, x, cos, sin) -> torch.Tensor:
        t = proj(x).view(x.shape[1], -1, self.head_dim)  # [T, heads, D]
        if norm is not None:
            t = norm(t)
        return apply_rope(t, cos, sin, self.kp)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        x, T = hidden_states, hidden_states.shape[1]
        cos, sin = position_embeddings
        q = self._heads(self.q_proj, self.q_norm, x, cos, sin)
        k = self._heads(self.k_proj, self.k_norm, x, cos, sin)
        v = self.v_proj(x).view(T, -1, self.head_dim)
        fn = ALL_ATTENTION_FUNCTIONS[self.config._attn_implementation]
        kwargs.pop("cache", None)
        kwargs.pop("use_cache", None)
        out, _ = fn(
            self,
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            attention_mask,
            dropout=0.0,
            scaling=self.scaling,
            **kwargs,
        )
        o = out.reshape(1, T, -1).to(dtype_of(self.kp.dense_math_dtype))
        return self.o_proj(o), None


# ---- MLP blocks ------------------------------------------------------------------------------
class ContractMLP(nn.Module):
    """The dense SwiGLU MLP: gate/up (column), ``silu_glu``, down (row). Keeps the HF MLP's
    ``gate_proj``/``up_proj``/``down_proj`` children."""

    def __init__(self, hf: nn.Module, kp: KernelPolicy) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = hf.gate_proj, hf.up_proj, hf.down_proj
        self.kp = kp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_glu(self.gate_proj(x), self.up_proj(x), self.kp))


class ContractMoE(nn.Module):
    """transformers 5's sparse MoE block (router ``gate.weight`` ``[E, H]``, stacked experts
    ``experts.gate_up_proj`` ``[E, 2F, H]`` and ``experts.down_proj`` ``[E, H, F]``) computed by
    ``kernels.moe.moe_block`` with the dense MLP's linears: the rollout's MoE block. The
    parameters stay where transformers keeps them (the state dict is unchanged)."""

    def __init__(self, hf: nn.Module, kp: KernelPolicy, group: Any) -> None:
        super().__init__()
        self.gate, self.experts = hf.gate, hf.experts
        self.top_k, self.normalize = hf.gate.top_k, bool(hf.gate.norm_topk_prob)
        self.kp, self.group = kp, group

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states.reshape(-1, hidden_states.shape[-1])
        gate_up, down = self.experts.gate_up_proj, self.experts.down_proj
        f = down.shape[-1]
        experts = [(gate_up[e, :f], gate_up[e, f:], down[e]) for e in range(down.shape[0])]
        group = self.group
        y = moe_block(
            x,
            self.gate.weight,
            experts,
            self.kp,
            top_k=self.top_k,
            normalize=self.normalize,
            act=silu_glu,
            column_linear=column_linear,
            row_partial=_row_partial,
            all_reduce=lambda t, g=None: all_reduce_for(self.kp)(t, group),
            group=group,
        )
        return y.reshape(hidden_states.shape)


def _row_partial(x: torch.Tensor, w: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    """A row linear's tile tree in the accumulation dtype (the MoE block's all-reduce and cast
    finish it, as the rollout's ``row_partial``)."""
    acc = dtype_of(kp.matmul_accumulation_dtype)

    def value() -> torch.Tensor:
        return invariant_matmul(x, w, shard_policy(kp, 1), out_dtype=acc)

    if not needs_grad(x, w):
        return value()
    return straight_through(value, lambda: F.linear(x, w).to(acc))
