"""Fault catalogue: every runtime-policy field and kernel choice, flipped on one side.

The catalogue is derived from the generated dataclasses (``dataclasses.fields``), so a field added
to a contract is injected without anyone remembering to list it. A flip must change the value;
string fields need an entry in ``STRING_ALTERNATIVES`` (a new one fails loudly until it has one).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..codegen.targets import by_role, get_target

_DTYPE_FLIP = {"bfloat16": "float32", "float16": "float32", "float32": "bfloat16"}

# kernel-policy string fields: the other legal choice
KERNEL_ALTERNATIVES: dict[str, dict[Any, Any]] = {
    "matmul_tile_order": {
        "sglang_first_level": "binary",
        "binary": "sglang_first_level",
        "fixed_runs": "binary",
    },
    "all_reduce": {"fixed_tree": "nccl", "nccl": "fixed_tree"},
    "moe_topk_tie_break": {
        "lowest_expert_id": "highest_expert_id",
        "highest_expert_id": "lowest_expert_id",
    },
    "moe_topk_normalisation": {
        "divide_by_topk_sum": "softmax_over_topk_logits",
        "softmax_over_topk_logits": "divide_by_topk_sum",
    },
    "moe_token_order": {"token_index": "unordered", "unordered": "token_index"},
    "moe_combine_order": {"expert_id": "topk_rank", "topk_rank": "expert_id"},
    "moe_ep_combine": {"gather_slots": "sum_partials", "sum_partials": "gather_slots"},
    # linear attention: LAPACK's triangular solve for the delta rule's chunk system; the shared
    # expert folded into the routed sum instead of added after its rounding
    "delta_rule_solve": {"row_substitution": "lapack", "lapack": "row_substitution"},
    "shared_expert_combine": {"after_routed": "first_in_fold", "first_in_fold": "after_routed"},
    # LoRA: the stock matmul, the scale on the other product, merged serving (W + s·B·A)
    "lora_matmul": {"invariant": "stock", "stock": "invariant"},
    "lora_scale_at": {"delta_output": "low_rank_output", "low_rank_output": "delta_output"},
    "lora_serving": {"unmerged": "merged"},
}

# kernel-policy fields that act only across the ranks of one layout axis (``Layout`` field): a
# side that runs no size above 1 on that axis leaves them out (nothing there could show them),
# and says so. ``all_reduce`` sums TP partials (row-parallel linears, the MoE block's experts);
# across one rank both orders return the partial itself.
AXIS_ONLY_FIELDS: dict[str, str] = {"moe_ep_combine": "ep", "all_reduce": "tp"}
AXIS_WHAT = {"ep": "expert parallelism", "tp": "tensor parallelism (a sum over TP ranks)"}


def left_out_reason(field: str, side: str, sizes: dict[str, int], where: str) -> str | None:
    """Why ``field``'s fault on ``side`` is left out, or None when it is tried: it acts only
    across ``AXIS_ONLY_FIELDS[field]`` ranks and ``sizes`` (that side's largest size per axis
    in this run, ``where`` naming them) has none above 1."""
    axis = AXIS_ONLY_FIELDS.get(field)
    if axis is None or sizes.get(axis, 1) > 1:
        return None
    return (
        f"acts only under {AXIS_WHAT[axis]}; the {side} runs no {axis.upper()} > 1 here ({where})"
    )


# runtime-policy string fields: what the stock engine would run instead
STRING_ALTERNATIVES: dict[str, dict[Any, Any]] = {
    "attention_backend": {"fa3_varlen": "sdpa", "sdpa": "fa3_varlen", None: "fa3_varlen"},
    "cp_layout": {"ulysses_a2a": None, None: "ulysses_a2a"},
    # the FSDP trainer's: transformers' stock attention; the other FSDP mixed-precision dtype
    "attn_implementation": {"true_on_policy_chunked": "sdpa", "sdpa": "true_on_policy_chunked"},
    "param_dtype": {"bfloat16": "float32", "float32": "bfloat16"},
    "reduce_dtype": {"float32": "bfloat16", "bfloat16": "float32"},
}

SKIPPED_FIELDS = ("contract_name",)  # identity, not behaviour


@dataclass(frozen=True)
class Fault:
    """One field flipped on one side."""

    side: str  # "rollout" or "trainer"
    kind: str  # "runtime" (that side's runtime policy) or "kernel" (the shared KernelPolicy)
    field: str
    target: str = ""  # the side's target (default: the role's default target in the registry)

    @property
    def target_name(self) -> str:
        return self.target or by_role(self.side).name  # type: ignore[arg-type]

    @property
    def name(self) -> str:
        """``sglang.F`` / ``megatron.F`` for runtime fields, ``kernel.F@rollout|trainer`` (a
        kernel fault given a target, as a second trainer's: ``kernel.F@<target>``)."""
        if self.kind == "kernel":
            return f"kernel.{self.field}@{self.target or self.side}"
        return f"{self.target_name}.{self.field}"

    @property
    def contract_path(self) -> str:
        """The field's path in a contract file (the key of its ``unobservable`` notes): the
        target's ``runtime_policy`` section (``Target.section``)."""
        if self.kind == "kernel":
            return f"kernel_policy.{self.field}"
        return f"runtime_policy.{get_target(self.target_name).section}.{self.field}"


@dataclass(frozen=True)
class SharedBug:
    """A bug planted in the one kernel library, so on BOTH sides at once (``kernels.planted``):
    bitwise parity cannot see it; the cross-TP comparison or transformers must."""

    bug: str

    @property
    def name(self) -> str:
        return f"shared.{self.bug}"

    @property
    def contract_path(self) -> None:
        return None  # not a contract field: never explained by ``unobservable`` notes


def shared_bugs() -> list[SharedBug]:
    from ..adapters.kernels.planted import BUGS  # heavy: torch, in a torch-free module

    return [SharedBug(b) for b in sorted(BUGS)]


def flipped(field: str, value: Any, kind: str) -> Any:
    """The value a fault injects in place of ``value``."""
    if isinstance(value, bool):
        return not value
    if field in ("matmul_k_runs", "matmul_column_k_runs"):
        # half the runs, each twice as long (one run: two): another tree and other runs
        return value // 2 if value > 1 else 2
    if isinstance(value, int):
        # An eighth of a power-of-two block, not a half: the kernels sum blocks with a pairwise
        # tree, and a complete pairwise tree over 2n equals two n-trees added, so halving a block
        # is often exact by construction and would prove nothing about the gate.
        return value // 8 if value >= 16 else value * 2
    if kind == "kernel" and field.endswith("_dtype"):
        return _DTYPE_FLIP[value]
    table = KERNEL_ALTERNATIVES if kind == "kernel" else STRING_ALTERNATIVES
    if field not in table or value not in table[field]:
        raise KeyError(
            f"no fault alternative for {kind} field {field!r} = {value!r}; add one to "
            "contractgen/parity/faults.py"
        )
    return table[field][value]


def catalogue(
    kernel_policy: Any,
    sglang_policy: Any,
    megatron_policy: Any,
    rollout_target: str = "",
    trainer_target: str = "",
    name_kernel_target: bool = False,
) -> list[Fault]:
    """Every fault: each side's runtime fields on that side, every kernel choice on both sides
    (both engines implement the same numerics, so each must read every kernel field). The
    targets default to each role's default target; ``name_kernel_target``: the trainer's kernel
    faults are named by its target (a second trainer's must not share the first's names)."""
    faults = [
        Fault("rollout", "runtime", f.name, rollout_target)
        for f in dataclasses.fields(sglang_policy)
        if f.name not in SKIPPED_FIELDS
    ]
    faults += [
        Fault("trainer", "runtime", f.name, trainer_target)
        for f in dataclasses.fields(megatron_policy)
        if f.name not in SKIPPED_FIELDS
    ]
    faults += [
        Fault(
            side,
            "kernel",
            f.name,
            trainer_target if name_kernel_target and side == "trainer" else "",
        )
        for f in dataclasses.fields(kernel_policy)
        if getattr(kernel_policy, f.name) is not None  # unset: a dense contract's MoE fields
        for side in ("rollout", "trainer")
    ]
    return faults
