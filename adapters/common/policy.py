"""The one kernel-policy resolution every target does once per model: the contract's generated
``KernelPolicy`` (typed at this edge, ``kernels.policy.kernel_policy``), the gate's dtype override
(every ``*_dtype`` field set to one dtype) and a kernel-policy fault. Each target resolves its
runtime policy (its own generated class) beside it."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..kernels.policy import KernelPolicy, kernel_policy
from .run_types import with_fault

DTYPE_FIELDS_SUFFIX = "_dtype"
DTYPE_OVERRIDES = (None, "bfloat16", "float32")


def with_dtype(kp: Any, dtype: str) -> Any:
    """Every dtype field of a kernel policy set to ``dtype`` (the gate's ``--dtype``)."""
    fields = {f.name: dtype for f in dataclasses.fields(kp) if f.name.endswith(DTYPE_FIELDS_SUFFIX)}
    return dataclasses.replace(kp, **fields)


def float32_kernel_policy(kp: KernelPolicy) -> KernelPolicy:
    """Every dtype field of a KernelPolicy set to float32 (the gate's ``--dtype float32``)."""
    return with_dtype(kp, "float32")


def resolve_kernel_policy(schema: Any, contract_id: str, run: Any) -> KernelPolicy:
    """The contract's ``KernelPolicy`` from a target's generated ``schema`` under ``run``'s
    ``dtype_override`` (None or ``"bfloat16"``: the contract's; ``"float32"``: every dtype field)
    and its kernel-policy fault (``run.fault``)."""
    kp = kernel_policy(schema.kernel_policy_for(contract_id))
    if run.dtype_override == "float32":
        kp = float32_kernel_policy(kp)
    elif run.dtype_override not in DTYPE_OVERRIDES:
        raise ValueError(
            f"dtype_override must be None, 'bfloat16' or 'float32' (got {run.dtype_override!r})"
        )
    if run.fault is not None and run.fault.kernel_policy:
        kp = with_fault(kp, run.fault.kernel_policy)
    return kp
