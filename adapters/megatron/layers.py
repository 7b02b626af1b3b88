"""SGLang-numerics layer classes that subclass megatron-core's own.

Each class keeps megatron-core's constructor, parameters, state-dict names and backward, and takes
its forward *values* from the SGLang kernels (``contractgen.adapters.kernels``) through
``autograd.kernel_value_linear`` (linears: megatron's backward, no second GEMM) or by running the
differentiable kernel directly (norms, residual add, SwiGLU). Behaviour is chosen from the generated runtime policy and the
contract's ``KernelPolicy`` (``config.true_on_policy``, resolved once by ``make_config``); runtime-policy
booleans select implementations through the lookup tables below, never by testing the contract.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.mlp import MLP

from ..kernels.all_reduce import tree_all_reduce
from ..kernels.linear import column_parallel_linear, row_parallel_linear
from ..kernels.matmul import shard_policy
from ..kernels.mlp import silu_glu
from ..kernels.norm import rms_norm
from ..kernels.policy import KernelPolicy
from ..kernels.residual import residual_add
from .autograd import kernel_value_linear
from .policy import dtype_of

# ---------------------------------------------------------------------------------------------
# Lookup tables: runtime-policy value -> implementation.
# ---------------------------------------------------------------------------------------------


def _stock_matmul(x: torch.Tensor, w: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    """megatron's own ``torch.matmul`` in the dense dtype (row-count dependent reduction)."""
    dt = dtype_of(kp.dense_math_dtype)
    return torch.matmul(x.to(dt), w.to(dt).t())


MATMUL_BY_BATCH_INVARIANT_MODE: dict[bool, Callable[..., torch.Tensor]] = {
    True: column_parallel_linear,  # the kernel itself: (x, w, kp) -> x @ w.T
    False: _stock_matmul,
}


def _row_linear_fixed_tree(x, w, kp: KernelPolicy, group, matmul):
    if matmul is column_parallel_linear:
        return row_parallel_linear(x, w, kp, group)
    return tree_all_reduce(matmul(x, w, kp), group)


def _row_linear_collective(x, w, kp: KernelPolicy, group, matmul):
    """megatron's own reduce: ``torch.distributed.all_reduce`` (ring / backend-chosen order) of
    the rank's local product (its K shard's runs: ``shard_policy``)."""
    tp = torch.distributed.get_world_size(group)
    partial = matmul(x, w, shard_policy(kp, tp))
    if tp == 1:
        return partial
    partial = partial.clone()
    torch.distributed.all_reduce(partial, group=group)
    return partial


ROW_REDUCE_BY_DETERMINISTIC_ROW_PARALLEL_REDUCE: dict[bool, Callable[..., torch.Tensor]] = {
    True: _row_linear_fixed_tree,
    False: _row_linear_collective,
}


def _cast_to(dtype_name_field: str) -> Callable[[torch.Tensor, Any], torch.Tensor]:
    def cast(x: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
        return x.to(dtype_of(getattr(kp, dtype_name_field)))

    return cast


def _keep(x: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    return x


ATTENTION_INPUT_CAST: dict[bool, Callable[[torch.Tensor, Any], torch.Tensor]] = {
    True: _cast_to("dense_math_dtype"),
    False: _keep,
}
LM_HEAD_INPUT_CAST: dict[bool, Callable[[torch.Tensor, Any], torch.Tensor]] = {
    True: _cast_to("lm_head_input_dtype"),
    False: _keep,
}


def _kernel_swiglu(fc1_out: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    gate, up = torch.chunk(fc1_out, 2, dim=-1)
    return silu_glu(gate, up, kp)


def _megatron_bias_swiglu(fc1_out: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    """megatron-core's fused ``bias_swiglu_impl`` (what runs without the contract)."""
    return bias_swiglu_impl(fc1_out, None)


SWIGLU_BY_DISABLE_BIAS_SWIGLU_FUSION: dict[bool, Callable[[torch.Tensor, Any], torch.Tensor]] = {
    True: _kernel_swiglu,
    False: _megatron_bias_swiglu,
}


# ---------------------------------------------------------------------------------------------
# Linears
# ---------------------------------------------------------------------------------------------


class SGLangColumnParallelLinear(ColumnParallelLinear):
    """Column-parallel linear: forward = SGLang batch-invariant matmul on the local shard.

    No communication in forward (each rank owns whole output columns); backward is megatron-core's
    ``linear_with_grad_accumulation_and_async_allreduce`` (dgrad all-reduce over TP).
    """

    lora_branch: Any = None
    """``megatron.lora.LoraBranch`` when the linear carries an unmerged adapter."""

    def __init__(self, *args: Any, config: Any, **kwargs: Any) -> None:
        super().__init__(*args, config=config, **kwargs)
        self.runtime_policy = config.true_on_policy.rp
        self.kernel_policy = config.true_on_policy.kernel
        self._matmul = MATMUL_BY_BATCH_INVARIANT_MODE[
            bool(self.runtime_policy.batch_invariant_mode)
        ]

    def _kernel_forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self._matmul(x, weight, self.kernel_policy)

    def forward(
        self,
        input_: torch.Tensor,
        weight: torch.Tensor | None = None,
        runtime_gather_output: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        w = self.weight if weight is None else weight
        if w is None:
            raise RuntimeError(f"{type(self).__name__}: no weight (skip_weight_param_allocation)")
        gather = self.gather_output if runtime_gather_output is None else runtime_gather_output
        if gather:
            raise NotImplementedError(
                f"{type(self).__name__}: gather_output is not supported; keep outputs "
                "parallel (vocab-parallel log-softmax gathers in fixed order itself)"
            )

        # megatron-core's own forward (its TP region mappings, its arguments to the linear),
        # whose GEMM call lands in ``_forward_impl`` below: the kernel's value there.
        out, bias = ColumnParallelLinear.forward(self, input_, weight, runtime_gather_output=False)
        if self.lora_branch is not None:  # an unmerged LoRA adapter (``megatron.lora``)
            out = self.lora_branch(input_, out)
        return out, bias

    def _forward_impl(self, input, weight, *args: Any, **kwargs: Any) -> torch.Tensor:
        return kernel_value_linear(
            lambda: self._kernel_forward(input, weight), input, weight, *args, **kwargs
        )


class SGLangOutputLayer(SGLangColumnParallelLinear):
    """LM head: casts its input (and weight) to ``lm_head_input_dtype`` per the runtime policy."""

    def __init__(self, *args: Any, config: Any, **kwargs: Any) -> None:
        super().__init__(*args, config=config, **kwargs)
        self._input_cast = LM_HEAD_INPUT_CAST[
            bool(self.runtime_policy.cast_lm_head_input_to_weight_dtype)
        ]

    def forward(self, input_, weight=None, runtime_gather_output=None):
        return super().forward(
            self._input_cast(input_, self.kernel_policy), weight, runtime_gather_output
        )

    def _kernel_forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # SGLang's LM head: weight in lm_head_input_dtype, output in the input's dtype.
        return self._matmul(
            x, weight.to(dtype_of(self.kernel_policy.lm_head_input_dtype)), self.kernel_policy
        )


class SGLangRowParallelLinear(RowParallelLinear):
    """Row-parallel linear: forward = SGLang row-parallel linear (invariant matmul on the local K
    shard, then the fixed-order tree all-reduce), replacing megatron's NCCL/gloo all-reduce.

    Backward is megatron-core's: ``LinearWithGradAccumulationAndAsyncCommunication`` for the
    local matmul; the TP all-reduce after it has the identity as its backward (one all-reduce
    per layer in training: the kernel's tree all-reduce).
    """

    lora_branch: Any = None
    """``megatron.lora.LoraBranch`` when the linear carries an unmerged adapter (its delta is
    added after the all-reduce, as the rollout adds it before the residual add)."""

    def __init__(self, *args: Any, config: Any, **kwargs: Any) -> None:
        super().__init__(*args, config=config, **kwargs)
        if self.sequence_parallel:
            raise ValueError(
                "true-on-policy contracts disable sequence parallel (schema: "
                "disable_megatron_sequence_parallel); got config.sequence_parallel=True"
            )
        self.runtime_policy = config.true_on_policy.rp
        self.kernel_policy = config.true_on_policy.kernel
        self._matmul = MATMUL_BY_BATCH_INVARIANT_MODE[
            bool(self.runtime_policy.batch_invariant_mode)
        ]
        self._reduce = ROW_REDUCE_BY_DETERMINISTIC_ROW_PARALLEL_REDUCE[
            bool(self.runtime_policy.deterministic_row_parallel_reduce)
        ]

    def forward(self, input_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self.input_is_parallel:
            raise NotImplementedError(f"{type(self).__name__} expects input_is_parallel=True")
        w = self.weight

        def kernel_value() -> torch.Tensor:
            return self._reduce(input_, w, self.kernel_policy, self.tp_group, self._matmul)

        # Megatron's local matmul then its TP all-reduce, whose backward is the identity: so the
        # value is the kernel's (local matmul and tree all-reduce) and the backward megatron's
        # local-matmul backward (no dgrad all-reduce: each rank holds its own K shard).
        out = kernel_value_linear(
            kernel_value, input_, w, None, self.gradient_accumulation_fusion,
            allreduce_dgrad=False, sequence_parallel=False, tp_group=self.tp_group,
        )  # fmt: skip
        if self.lora_branch is not None:
            out = self.lora_branch(input_, out)
        if self.skip_bias_add:
            return out, self.bias
        return (out + self.bias if self.bias is not None else out), None


# ---------------------------------------------------------------------------------------------
# Norms
# ---------------------------------------------------------------------------------------------


def _stored_weight(weight: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    return weight


def _zero_centred_weight(weight: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    """A zero-centred norm's stored ``w`` is the scale minus one: ``1 + w`` formed in
    ``norm_compute_dtype``, as the rollout's ``_norm`` forms it."""
    return 1.0 + weight.to(dtype_of(kp.norm_compute_dtype))


# megatron's ``layernorm_zero_centered_gamma`` (the family's ``zero_centred_norm``) -> the scale
NORM_SCALE_BY_ZERO_CENTERED_GAMMA: dict[bool, Callable[[torch.Tensor, Any], torch.Tensor]] = {
    False: _stored_weight,
    True: _zero_centred_weight,
}


class SGLangNorm(torch.nn.RMSNorm):
    """RMSNorm with SGLang numerics (``kernels.norm.rms_norm``), a drop-in for megatron's
    ``WrappedTorchNorm`` (same ``weight`` parameter name, built with ``config, hidden_size, eps``);
    zero-centred (``(1 + w) * normalize(x)``) where the config's
    ``layernorm_zero_centered_gamma`` says.

    The kernel is plain differentiable torch code, so autograd differentiates it directly.
    """

    zero_centred_allowed = True
    """False for a norm the family never zero-centres (the Gated DeltaNet output norm)."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **kwargs: Any) -> None:
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        self.config = config
        self.runtime_policy = config.true_on_policy.rp
        self.kernel_policy = self._norm_kernel_policy(config.true_on_policy.kernel)
        self._scale = NORM_SCALE_BY_ZERO_CENTERED_GAMMA[
            bool(config.layernorm_zero_centered_gamma) and self.zero_centred_allowed
        ]
        for p in self.parameters():
            p.sequence_parallel = bool(config.sequence_parallel)

    def _norm_kernel_policy(self, kp: KernelPolicy) -> Any:
        return kp

    def scale(self) -> torch.Tensor:
        """The multiplier the norm applies: its weight, or ``1 + weight`` when zero-centred."""
        return self._scale(self.weight, self.kernel_policy)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.scale(), self.eps, self.kernel_policy)


class SGLangQKRMSNorm(SGLangNorm):
    """Per-head q/k RMSNorm; ``cast_qk_norm_input_before_weight_mul`` picks whether the normalised
    value is rounded to the input dtype before the weight multiply (``norm_cast_before_weight``)."""

    def _norm_kernel_policy(self, kp: KernelPolicy) -> Any:
        return dataclasses.replace(
            kp,
            norm_cast_before_weight=bool(self.runtime_policy.cast_qk_norm_input_before_weight_mul),
        )


class _SplitCarrier(torch.autograd.Function):
    """``(carrier[..., :h], carrier[..., h:])`` whose backward joins the two gradients with one
    ``cat`` instead of autograd's two zero-filled slice gradients and their sum. That sum adds
    +0 to every element, which turns -0 into +0; ``add_(0.0)`` does the same, so the gradient
    has its bits (one cat and one add per layer instead of two fills, two copies and an add)."""

    @staticmethod
    def forward(ctx, carrier: torch.Tensor, h: int):
        ctx.set_materialize_grads(False)
        ctx.shape = carrier.shape
        return carrier[..., :h], carrier[..., h:]

    @staticmethod
    def backward(ctx, d_output, d_residual):
        if d_output is None and d_residual is None:
            return None, None
        if d_output is None or d_residual is None:  # one slice's gradient alone: nothing added
            d = d_residual if d_output is None else d_output
            parts = [d, d.new_zeros((*ctx.shape[:-1], ctx.shape[-1] - d.shape[-1]))]
            return torch.cat(parts[::-1] if d_output is None else parts, dim=-1), None
        return torch.cat([d_output, d_residual], dim=-1).add_(0.0), None


def split_carrier(
    carrier: torch.Tensor, hidden_size: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A residual-pair carrier ``cat([output, residual], -1)`` -> ``(output, residual)``;
    a plain hidden state -> ``(hidden, None)``. Slicing moves bits, it never rounds."""
    if carrier.shape[-1] == 2 * hidden_size:
        return _SplitCarrier.apply(carrier, hidden_size)
    return carrier, None


def join_carrier(output: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``(output, residual)`` -> one tensor that crosses layer and pipeline-stage boundaries
    unchanged (concatenation, no cast and no add)."""
    return torch.cat([output, residual], dim=-1)


class SGLangFinalRMSNorm(SGLangNorm):
    """Final norm that consumes the residual-pair carrier as SGLang's ``norm(hidden, residual)``
    does: residual add, then RMSNorm. A plain hidden state is normalised directly."""

    def forward(self, carrier: torch.Tensor) -> torch.Tensor:
        hidden, residual = split_carrier(carrier, self.weight.shape[0])
        if residual is not None:
            hidden = residual_add(hidden, residual, self.kernel_policy)
        return super().forward(hidden)


class MegatronFinalRMSNorm(SGLangFinalRMSNorm):
    """The final norm without ``use_sglang_final_norm``: megatron's stock ``torch.nn.RMSNorm``
    (``F.rms_norm`` in the input dtype, no cast before the weight multiply)."""

    def forward(self, carrier: torch.Tensor) -> torch.Tensor:
        hidden, residual = split_carrier(carrier, self.weight.shape[0])
        if residual is not None:
            hidden = residual_add(hidden, residual, self.kernel_policy)
        return F.rms_norm(hidden, (hidden.shape[-1],), self.scale().to(hidden.dtype), self.eps)


FINAL_NORM_BY_USE_SGLANG_FINAL_NORM: dict[bool, type] = {
    True: SGLangFinalRMSNorm,
    False: MegatronFinalRMSNorm,
}


# ---------------------------------------------------------------------------------------------
# MLP
# ---------------------------------------------------------------------------------------------


class SGLangMLP(MLP):
    """megatron-core's MLP (``linear_fc1`` = [gate; up] per TP rank, ``linear_fc2``) with the
    activation chosen by ``disable_bias_swiglu_fusion``: SGLang's ``silu_glu`` kernel or
    megatron's fused ``bias_swiglu_impl``."""

    def __init__(self, config: Any, submodules: Any, **kwargs: Any) -> None:
        super().__init__(config, submodules, **kwargs)
        self.runtime_policy = config.true_on_policy.rp
        self.kernel_policy = config.true_on_policy.kernel
        self._swiglu = SWIGLU_BY_DISABLE_BIAS_SWIGLU_FUSION[
            bool(self.runtime_policy.disable_bias_swiglu_fusion)
        ]

    def forward(self, hidden_states: torch.Tensor, per_token_scale=None, **kwargs: Any):
        return sglang_mlp_forward(self, hidden_states, self._swiglu, self.kernel_policy)


def sglang_mlp_forward(mlp: MLP, hidden_states: torch.Tensor, swiglu: Callable, kp: KernelPolicy):
    """SGLang's MLP on a megatron ``MLP``'s linears: input rounded to the dense math dtype (as
    SGLang rounds the norm output before gate/up), ``linear_fc1`` ([gate; up]), ``swiglu``,
    ``linear_fc2``. Returns ``linear_fc2``'s ``(output, bias)``. Shared by the dense MLP and each
    routed expert (``moe.SGLangSequentialMLP``), whose ``MLP`` megatron-core builds itself."""
    fc1_out, _ = mlp.linear_fc1(hidden_states.to(dtype_of(kp.dense_math_dtype)))
    return mlp.linear_fc2(swiglu(fc1_out, kp))


__all__ = [
    "FINAL_NORM_BY_USE_SGLANG_FINAL_NORM",
    "MegatronFinalRMSNorm",
    "SGLangColumnParallelLinear",
    "SGLangFinalRMSNorm",
    "SGLangMLP",
    "SGLangNorm",
    "SGLangOutputLayer",
    "SGLangQKRMSNorm",
    "SGLangRowParallelLinear",
    "join_carrier",
    "residual_add",
    "sglang_mlp_forward",
    "split_carrier",
]
