"""The FSDP target's policies, resolved once per model: the generated runtime policy
(``load_target("fsdp")``, the code miles would vendor) and the contract's ``KernelPolicy``, with a
run's dtype override and trainer-side faults applied. ``FsdpPolicy`` is what ``model.py`` and
``ops.py`` are handed; nothing below it looks a policy up again."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

from contractgen.codegen.vendored import load_target

from ..common.policy import resolve_kernel_policy
from ..common.run_types import with_fault
from ..kernels.policy import KernelPolicy


@cache
def generated() -> Any:
    """The generated fsdp target (``.schema`` and ``.runtime_policy`` modules)."""
    return load_target("fsdp")


@dataclass(frozen=True)
class FsdpPolicy:
    """One model's policies: ``kp`` (the shared ``KernelPolicy``) and ``rp``
    (``FsdpTrueOnPolicyRuntimePolicy``); ``float32`` marks the gate's float32 diagnostic mode,
    where FSDP gathers parameters in float32 too."""

    kp: KernelPolicy
    rp: Any
    float32: bool = False

    @property
    def param_dtype(self) -> torch.dtype:
        """FSDP's ``MixedPrecisionPolicy.param_dtype`` (float32 in the float32 mode)."""
        return torch.float32 if self.float32 else getattr(torch, self.rp.param_dtype or "float32")

    @property
    def reduce_dtype(self) -> torch.dtype:
        return getattr(torch, self.rp.reduce_dtype or "float32")

    @property
    def master_dtype(self) -> torch.dtype:
        """The sharded parameters' own dtype (what AdamW updates)."""
        return torch.float32 if self.rp.keep_fp32_master else self.param_dtype


def resolve(contract_id: str, run: Any) -> FsdpPolicy:
    """The contract's policies under ``run``'s ``dtype_override`` and ``fault``."""
    gen = generated()
    kp = resolve_kernel_policy(gen.schema, contract_id, run)
    rp = gen.runtime_policy.policy_for(contract_id, None)
    fault = run.fault
    if fault is not None and fault.runtime_policy:
        rp = with_fault(rp, fault.runtime_policy)
    if not rp.enabled:
        rp = gen.runtime_policy.DEFAULT_RUNTIME_POLICY
    return FsdpPolicy(kp=kp, rp=rp, float32=run.dtype_override == "float32")
