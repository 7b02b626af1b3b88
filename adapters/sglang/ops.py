"""The rollout's op set, chosen from (KernelPolicy, SGLangTrueOnPolicyRuntimePolicy) by lookup.

Each runtime-policy switch selects between the contract kernel and its stock variant through
``SWITCHES``; nothing else in the forward path looks at the runtime policy. ``enabled=False`` turns
every switch off (the stock engine).

Switches in ``CROSS_RANK_SWITCHES`` decide what happens *between* TP ranks; with one rank the
contract op and the stock op are the same computation, which is why the generated policy only turns
them on for rollout TP>1 (``when: rollout_tp``). At TP=1 they resolve to the contract op, so the
row-parallel linear stays the full invariant tree (as the trainer computes it) instead of a GEMM of
whatever order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from ..kernels import stock
from ..kernels._dtypes import dtype_of
from ..kernels.all_reduce import all_reduce_for
from ..kernels.lora import lora_add
from ..kernels.matmul import invariant_matmul, shard_policy
from ..kernels.norm import rms_norm
from ..kernels.policy import KernelPolicy
from ..kernels.residual import residual_add
from ..kernels.rope import apply_rope


# ---- contract ops (signatures shared with their stock twins) ---------------------------------
def _column_linear(x: torch.Tensor, w: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    return invariant_matmul(x, w, kp)


def _row_partial(x: torch.Tensor, w: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    """The rank's subtree in the accumulation dtype (the all-reduce finishes the tree)."""
    return invariant_matmul(x, w, kp, out_dtype=dtype_of(kp.matmul_accumulation_dtype))


def _row_partial_of_shard(tp: int) -> Callable:
    """``_row_partial`` on a rank of ``tp``: its K is ``shard_policy(kp, tp)``'s runs."""

    def row_partial(x: torch.Tensor, w: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
        return _row_partial(x, w, shard_policy(kp, tp))

    return row_partial


def _stock_row_partial(x: torch.Tensor, w: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    return stock.plain_matmul(x, w, kp)


def _stock_column_linear(x: torch.Tensor, w: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    return stock.fp32_linear(x, w, kp)


def _reduce_then_residual(
    partial_: torch.Tensor,
    residual: torch.Tensor,
    kp: KernelPolicy,
    group=None,
    all_reduce=None,
    delta=None,
) -> torch.Tensor:
    """All-reduce (fixed tree), round to the dense dtype, add a LoRA ``delta`` if any
    (``kernels.lora.lora_add``), then the residual add."""
    reduced = all_reduce(partial_, group).to(dtype_of(kp.dense_math_dtype))
    if delta is not None:
        reduced = lora_add(reduced, delta, kp)
    return residual_add(reduced, residual, kp)


def _qk_norm_then_rope(x_LHD, weight, eps, cos, sin, kp: KernelPolicy) -> torch.Tensor:
    """QK-norm rounded to the activation dtype, then RoPE (``disable_fused_qk_norm_mrope``)."""
    return apply_rope(rms_norm(x_LHD, weight, eps, kp), cos, sin, kp)


def _lm_head(h: torch.Tensor, w: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    """Final hidden state and LM-head weight cast to ``kp.lm_head_input_dtype``, invariant matmul."""
    lm = dtype_of(kp.lm_head_input_dtype)
    return invariant_matmul(h.to(lm), w.to(lm), kp)


def _stock_lm_head(h: torch.Tensor, w: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    return stock.fp32_linear(h, w, kp, out_dtype=torch.float32)


# The contract's all-reduce is the one the kernel policy names (``all_reduce_for(kp)``).
KERNEL_POLICY_ALL_REDUCE = None

# switch -> (op name, contract op, stock op)
SWITCHES: dict[str, tuple[str, Callable, Callable]] = {
    "force_bfloat16_dense_tensor_math": ("column_linear", _column_linear, _stock_column_linear),
    "force_bfloat16_lm_head": ("lm_head", _lm_head, _stock_lm_head),
    "tp_invariant_row_linear": ("row_partial", _row_partial, _stock_row_partial),
    "deterministic_tree_all_reduce": (
        "all_reduce",
        KERNEL_POLICY_ALL_REDUCE,
        stock.nccl_all_reduce,
    ),
    "disable_reduce_scatter": (
        "mlp_all_reduce",
        KERNEL_POLICY_ALL_REDUCE,
        stock.reduce_scatter_all_gather,
    ),
    "disable_flashinfer_allreduce_fusion": (
        "attn_reduce_residual",
        _reduce_then_residual,
        stock.fused_all_reduce_residual,
    ),
    "disable_mlp_allreduce_fusion": (
        "mlp_reduce_residual",
        _reduce_then_residual,
        stock.fused_all_reduce_residual,
    ),
    "disable_fused_qk_norm_mrope": ("qk_norm_rope", _qk_norm_then_rope, stock.fused_qk_norm_rope),
}

CROSS_RANK_SWITCHES = frozenset(
    {
        "tp_invariant_row_linear",
        "deterministic_tree_all_reduce",
        "disable_flashinfer_allreduce_fusion",
    }
)


@dataclass(frozen=True)
class RolloutOps:
    """The concrete callables one forward pass uses."""

    column_linear: Callable
    row_partial: Callable
    attn_reduce_residual: Callable  # (partial, residual, kp, group) -> residual stream
    mlp_reduce_residual: Callable
    mlp_all_reduce: Callable  # (partial, group) -> sum: the MoE block's expert outputs
    qk_norm_rope: Callable
    lm_head: Callable
    switches: dict[str, bool]


def switch_states(rp, tp_size: int) -> dict[str, bool]:
    """Which switches select the contract op (True) for this runtime policy and TP size."""
    return {
        name: bool(rp.enabled)
        and (bool(getattr(rp, name)) or (name in CROSS_RANK_SWITCHES and tp_size == 1))
        for name in SWITCHES
    }


def resolve_ops(kp: KernelPolicy, rp, tp_size: int) -> RolloutOps:
    """Look every op up in ``SWITCHES`` (the only reader of the runtime policy)."""
    on = switch_states(rp, tp_size)
    chosen = {
        op: (contract if on[name] else stock_op)
        for name, (op, contract, stock_op) in SWITCHES.items()
    }
    all_reduce = all_reduce_for(kp) if on["deterministic_tree_all_reduce"] else chosen["all_reduce"]
    mlp_all_reduce = all_reduce if on["disable_reduce_scatter"] else chosen["mlp_all_reduce"]
    row_partial = chosen["row_partial"]
    if row_partial is _row_partial:  # the rank's share of the row K's runs (TP=1: all of them)
        row_partial = _row_partial_of_shard(tp_size)
    return RolloutOps(
        column_linear=chosen["column_linear"],
        row_partial=row_partial,
        attn_reduce_residual=partial(chosen["attn_reduce_residual"], all_reduce=all_reduce),
        mlp_reduce_residual=partial(chosen["mlp_reduce_residual"], all_reduce=mlp_all_reduce),
        mlp_all_reduce=mlp_all_reduce,
        qk_norm_rope=chosen["qk_norm_rope"],
        lm_head=chosen["lm_head"],
        switches=on,
    )
