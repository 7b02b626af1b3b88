"""SiLU-GLU activation of the MLP."""

from __future__ import annotations

import torch

from . import planted
from .policy import KernelPolicy
from .registry import kernel


def silu_glu(gate: torch.Tensor, up: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    """``silu(gate) * up`` by the backend the registry names for ``gate``'s device
    (``reference_silu_glu`` is the contract; a planted sign flip runs the reference)."""
    if planted.active("silu_glu_sign_flip"):
        return reference_silu_glu(gate, up, kp)
    return kernel("silu_glu", gate.device)(gate, up, kp)


def reference_silu_glu(gate: torch.Tensor, up: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    """``silu(gate) * up``: silu in float32 as ``g / (1 + exp(-g))``, rounded to ``gate``'s dtype,
    then multiplied by ``up`` in that dtype (HF's ``act_fn(gate) * up`` cast order).

    ``torch.sigmoid``/``F.silu`` are not used: on CPU their vector body and scalar tail differ in
    the last bit, so a value's bits would depend on its position in the tensor (batch shape).
    """
    g32 = gate.to(torch.promote_types(gate.dtype, torch.float32))  # float64 stays float64
    act = g32 / (1.0 + torch.exp(-g32))
    if planted.active("silu_glu_sign_flip"):  # the parity gate's self-test only
        act = -act
    return act.to(gate.dtype) * up.to(gate.dtype)
