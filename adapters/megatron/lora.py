"""LoRA on the trainer: megatron-core's fused linears with the rollout's unmerged adapter path.

megatron fuses what HF (and the rollout) keep apart: ``linear_qkv`` is q/k/v per query group
(``checkpoint.fused_qkv``), ``linear_fc1`` is ``[gate; up]`` per TP rank. The adapters stay per
HF projection (PEFT's, the rollout's): each projection's delta is ``kernels.lora.lora_delta``
(the rollout's call, same kernels and TP split), the deltas are laid out as the fused output is
(``FUSED_LAYOUTS``) and added with ``kernels.lora.lora_add``. The invariant matmul's columns do
not depend on which other columns are computed with them, so a fused base output plus the fused
deltas has the rollout's per-projection bits.

The forward value is the kernel's; gradients flow through a plain float32 autograd twin of the
same formula (``autograd.straight_through``), with megatron's TP mappings where the TP split
needs them: a column linear's replicated A and its input get their gradient partial sums
all-reduced (``copy_to_tensor_model_parallel_region``), a row linear's ``x·Aᵀ`` partial sums are
all-reduced in the twin's forward (``reduce_from_tensor_model_parallel_region``). The adapter
parameters are ``LoraBranch`` modules kept outside megatron's module tree (no new state-dict
names: the base checkpoint paths and weight gathering are untouched); ``lora_parameters``
lists them for the optimizer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
)

from contractgen.adapters.families import LAYER_PREFIX

from ..common.lora import LORA_ALPHA_KEY, adapter_names, split_adapter
from ..kernels.lora import lora_add, lora_delta, lora_scale, merged_delta
from ..kernels.planted import active
from ..kernels.policy import KernelPolicy
from .autograd import straight_through
from .policy import dtype_of


def _fuse_qkv(parts: list[torch.Tensor], ng: int, dim: int) -> torch.Tensor:
    """q, k, v blocks along ``dim`` -> megatron's per-query-group ``[q…; k; v]`` along ``dim``."""
    moved = [p.movedim(dim, 0) for p in parts]
    grouped = [m.reshape(ng, m.shape[0] // ng, *m.shape[1:]) for m in moved]
    fused = torch.cat(grouped, dim=1)
    return fused.reshape(-1, *fused.shape[2:]).movedim(0, dim)


def _fuse_cat(parts: list[torch.Tensor], ng: int, dim: int) -> torch.Tensor:
    return torch.cat(parts, dim=dim)


# megatron module path in a decoder layer -> (HF roles in fused order, how they are fused)
FUSED_LAYOUTS: dict[str, tuple[tuple[str, ...], Callable[..., torch.Tensor]]] = {
    "self_attention.linear_qkv": (("q", "k", "v"), _fuse_qkv),
    "self_attention.linear_proj": (("o",), _fuse_cat),
    "mlp.linear_fc1": (("gate", "up"), _fuse_cat),
    "mlp.linear_fc2": (("down",), _fuse_cat),
}


class LoraBranch(torch.nn.Module):
    """One fused megatron linear's adapters (this TP rank's shards), applied to its output."""

    def __init__(
        self,
        roles: tuple[str, ...],
        pairs: list[tuple[torch.Tensor, torch.Tensor]],
        split: str,
        fuse: Callable,
        groups: int,
        alpha: float,
        kp: KernelPolicy,
        tp_group: Any,
        names: list[tuple[str, str]] | None = None,
    ) -> None:
        super().__init__()
        self.roles, self.split, self.fuse, self.groups = roles, split, fuse, groups
        self.names = names or []  # per role, the HF names of its (A, B) (``gather_adapter``)
        self.kp, self.tp_group, self.alpha = kp, tp_group, alpha
        self.a = torch.nn.ParameterList([torch.nn.Parameter(a.float().clone()) for a, _ in pairs])
        self.b = torch.nn.ParameterList([torch.nn.Parameter(b.float().clone()) for _, b in pairs])

    def _rounded(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        ad = dtype_of(self.kp.lora_adapter_dtype)
        return [(a.detach().to(ad), b.detach().to(ad)) for a, b in zip(self.a, self.b, strict=True)]

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        kp, deltas = self.kp, []
        for a, b in self._rounded():
            s = lora_scale(self.alpha, a.shape[0], kp)
            deltas.append(lora_delta(x, a, b, s, kp, split=self.split, group=self.tp_group))
        return self.fuse(deltas, self.groups, -1)

    def _twin(self, x: torch.Tensor) -> torch.Tensor:
        """The same formula in float32 autograd, with megatron's TP mappings (gradients only)."""
        deltas = []
        for a, b in zip(self.a, self.b, strict=True):
            s = self.alpha / a.shape[0]
            if active("lora_grad_scale_twice"):  # a planted backward bug (kernels.planted)
                s = s * s
            if self.split == "column":
                xa = copy_to_tensor_model_parallel_region(x.float(), group=self.tp_group)
                aa = copy_to_tensor_model_parallel_region(a, group=self.tp_group)
                t = xa @ aa.t()
            else:
                t = reduce_from_tensor_model_parallel_region(x.float() @ a.t(), group=self.tp_group)
            deltas.append((t @ b.t()) * s)
        return self.fuse(deltas, self.groups, -1)

    def forward(self, x: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        """``lora_add(base, fused deltas)`` with the kernel's value."""
        x = x.to(dtype_of(self.kp.dense_math_dtype))
        delta = straight_through(lambda: self._kernel(x), lambda: self._twin(x), [x, *self.a])
        return lora_add(base, delta, self.kp)

    @torch.no_grad()
    def merge_into(self, weight: torch.Tensor) -> None:
        """Merged serving (fault injection only): ``W + s·B·A`` fused like the weight, rounded."""
        parts = [
            merged_delta(a, b, lora_scale(self.alpha, a.shape[0], self.kp))
            for a, b in self._rounded()
        ]
        weight.copy_((weight.float() + self.fuse(parts, self.groups, 0)).to(weight.dtype))


def _local(t: torch.Tensor, how: str, rank: int, size: int) -> torch.Tensor:
    if how == "rows":
        return torch.chunk(t, size, dim=0)[rank]
    if how == "cols":
        return torch.chunk(t, size, dim=1)[rank]
    return t


def attach_lora(
    model: torch.nn.Module,
    weights: Mapping[str, torch.Tensor] | Any,
    arch: Any,
    kp: KernelPolicy,
    *,
    tp_rank: int,
    tp_size: int,
    tp_group: Any,
) -> list[LoraBranch]:
    """Give this stage's fused linears the adapters in ``weights`` (none: nothing changes),
    served as ``kp.lora_serving`` says. Returns the branches (their parameters are what a LoRA
    run trains)."""
    adapter = split_adapter(weights)[1] if isinstance(weights, Mapping) else {}
    if not adapter:
        return []
    if kp.lora_adapter_dtype is None:
        raise ValueError(
            "the weights carry a LoRA adapter but the contract has no LoRA numerics "
            "(kernel_policy.lora_*): use a LoRA contract"
        )
    alpha = float(adapter[LORA_ALPHA_KEY])
    spec, branches = arch.spec, []
    groups = arch.num_kv_heads // tp_size
    for layer in getattr(model.decoder, "layers", []):
        i = layer.layer_number - 1
        for path, (roles, fuse) in FUSED_LAYOUTS.items():
            names = [
                adapter_names(LAYER_PREFIX.format(i=i) + spec.layer_weights[r].hf_name)
                for r in roles
            ]
            if not any(a in adapter for a, _ in names):
                continue
            split = spec.layer_weights[roles[0]].shard
            a_how, b_how = ("whole", "rows") if split == "column" else ("cols", "whole")
            pairs = [
                (
                    _local(adapter[a], a_how, tp_rank, tp_size),
                    _local(adapter[b], b_how, tp_rank, tp_size),
                )
                for a, b in names
            ]
            module = layer.get_submodule(path)
            branch = LoraBranch(roles, pairs, split, fuse, groups, alpha, kp, tp_group, names)
            branch.to(module.weight.device)
            SERVING[kp.lora_serving](module, branch)
            branches.append(branch)
    return branches


def _serve_unmerged(module: torch.nn.Module, branch: LoraBranch) -> None:
    # kept off megatron's module tree (``object.__setattr__``): no new state-dict names
    object.__setattr__(module, "lora_branch", branch)


def _serve_merged(module: torch.nn.Module, branch: LoraBranch) -> None:
    branch.merge_into(module.weight)


# kernel_policy.lora_serving -> how a fused linear takes its adapters
SERVING: dict[str, Callable[[torch.nn.Module, LoraBranch], None]] = {
    "unmerged": _serve_unmerged,
    "merged": _serve_merged,
}


def _gather_pairs(
    branches: list[LoraBranch], tp_group: Any, pairs: Callable[[LoraBranch], list]
) -> dict[str, torch.Tensor]:
    """``pairs(branch)`` (per role, an (A-like, B-like) pair of this rank's shards) under HF
    adapter names, TP shards concatenated (a column linear's B by output rows, a row linear's A
    by input columns). Collective over ``tp_group``."""
    n = torch.distributed.get_world_size(tp_group) if tp_group is not None else 1

    def whole(t: torch.Tensor, dim: int) -> torch.Tensor:
        if n == 1:
            return t.contiguous()
        parts = [torch.empty_like(t) for _ in range(n)]
        torch.distributed.all_gather(parts, t.contiguous(), group=tp_group)
        return torch.cat(parts, dim=dim)

    out: dict[str, torch.Tensor] = {}
    for branch in branches:
        a_dim, b_dim = (None, 0) if branch.split == "column" else (1, None)
        for (a_name, b_name), (a, b) in zip(branch.names, pairs(branch), strict=True):
            out[a_name] = a.contiguous() if a_dim is None else whole(a, a_dim)
            out[b_name] = b.contiguous() if b_dim is None else whole(b, b_dim)
    return out


def gather_adapter(branches: list[LoraBranch], tp_group: Any) -> dict[str, torch.Tensor]:
    """The adapter as the rollout serves it, under HF adapter names: each A and B rounded to
    ``kp.lora_adapter_dtype`` (the bits the forward uses; the trainer's fp32 masters stay here),
    TP shards concatenated, plus ``LORA_ALPHA_KEY``. Collective over ``tp_group``; empty without
    branches."""
    out = _gather_pairs(branches, tp_group, LoraBranch._rounded)
    if branches:
        out[LORA_ALPHA_KEY] = torch.tensor(branches[0].alpha, dtype=torch.float64)
    return out


def gather_adapter_grads(branches: list[LoraBranch], tp_group: Any) -> dict[str, torch.Tensor]:
    """Every A's and B's gradient (float32, zeros where none flowed) under HF adapter names, TP
    shards concatenated: what the step-0 gradient check compares with peft's float64 autograd.
    Collective over ``tp_group``."""

    def grads(branch: LoraBranch) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [
            tuple(torch.zeros_like(p) if p.grad is None else p.grad.detach() for p in (a, b))
            for a, b in zip(branch.a, branch.b, strict=True)
        ]

    return _gather_pairs(branches, tp_group, grads)


def lora_parameters(branches: list[LoraBranch]) -> Iterator[torch.nn.Parameter]:
    """Every A and B of ``branches`` (what the optimizer of a LoRA run holds)."""
    for branch in branches:
        yield from branch.parameters()
