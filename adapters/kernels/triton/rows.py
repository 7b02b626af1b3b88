"""How the small-op kernels read a tensor's rows in place: ``[A, H, n]`` with strides
``(s_a, s_h, 1)``, row ``r`` at ``(r // H) * s_a + (r % H) * s_h``. A view, not a copy, for the
strided operands the trainer hands them: the halves of the fused gate/up projection and the
per-head k of the fused QKV (megatron's split of ``[s, b, groups, (rep + 2) * head_dim]``), whose
rows are one stride apart but not ``n``. Rows two strides apart (a slice of the head dim's
neighbour, ``[A, H + 1, n][:, :H]``) are read in place too."""

from __future__ import annotations

import torch


def rows_AHn(x: torch.Tensor) -> torch.Tensor:
    """``x`` (at least 1-d) as ``[A, H, n]`` rows of unit-stride columns: a view where the dims
    before the last two collapse into one, else a contiguous copy."""
    n = x.shape[-1]
    if x.dim() == 1:
        x3 = x.view(1, 1, n)
    elif x.dim() == 2:
        x3 = x.unsqueeze(1)
    else:
        try:
            x3 = x.view(-1, x.shape[-2], n)
        except RuntimeError:  # leading dims that no single stride walks
            x3 = x.reshape(-1, x.shape[-2], n).contiguous()
    if x3.stride(-1) != 1 and n > 1:
        x3 = x3.contiguous()
    return x3
