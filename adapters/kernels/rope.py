"""Rotary position embedding, neox style (rotate halves), in the policy's rope dtype.

Frequency schedules follow Hugging Face ``modeling_rope_utils`` for ``default``, ``linear``,
``llama3`` and ``yarn``; any other ``rope_type`` is refused by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

from ._dtypes import dtype_of
from .policy import KernelPolicy
from .registry import kernel


def _inv_freq_default(head_dim: int, theta: float) -> torch.Tensor:
    exps = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta**exps)


def _default(head_dim, theta, params, max_pos):
    return _inv_freq_default(head_dim, theta), 1.0


def _linear(head_dim, theta, params, max_pos):
    return _inv_freq_default(head_dim, theta) / float(params["factor"]), 1.0


def _llama3(head_dim, theta, params, max_pos):
    inv_freq = _inv_freq_default(head_dim, theta)
    factor = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    old_ctx = float(params["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled), 1.0


def _yarn(head_dim, theta, params, max_pos):
    factor = params.get("factor")
    old_ctx = params.get("original_max_position_embeddings") or max_pos
    if factor is None:
        factor = max_pos / old_ctx
    factor = float(factor)

    def get_mscale(scale, mscale=1.0):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        ms, ms_all = params.get("mscale"), params.get("mscale_all_dim")
        if ms and ms_all:
            attention_factor = float(get_mscale(factor, ms) / get_mscale(factor, ms_all))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def corr_dim(rot):
        return (head_dim * math.log(old_ctx / (rot * 2 * math.pi))) / (2 * math.log(theta))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp(
        (torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1
    )
    pos_freqs = theta ** (torch.arange(0, head_dim, 2).to(torch.float32) / head_dim)
    extrap, interp = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    extrap_factor = 1 - ramp
    return interp * (1 - extrap_factor) + extrap * extrap_factor, float(attention_factor)


ROPE_TYPES: dict[str, Callable] = {
    "default": _default,
    "linear": _linear,
    "llama3": _llama3,
    "yarn": _yarn,
}


def rope_params(scaling) -> dict:
    """Normalise a profile's ``rope_scaling`` (None, a mapping, or a tuple of (key, value) pairs)."""
    if scaling is None:
        return {"rope_type": "default"}
    params = dict(scaling.items()) if isinstance(scaling, Mapping) else dict(scaling)
    params.setdefault("rope_type", params.pop("type", "default"))
    return params


def rope_cos_sin(
    positions: torch.Tensor,
    head_dim: int,
    theta: float,
    scaling,
    kp: KernelPolicy,
    *,
    max_position: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos_LD, sin_LD`` for absolute ``positions`` (neox layout: the frequencies repeated for
    both halves), in ``kp.rope_dtype``. Each position's row depends only on that position."""
    params = rope_params(scaling)
    kind = params["rope_type"]
    try:
        init = ROPE_TYPES[kind]
    except KeyError:
        raise ValueError(
            f"unsupported rope_scaling type {kind!r}; supported: {sorted(ROPE_TYPES)}"
        ) from None
    inv_freq, attention_factor = init(head_dim, float(theta), params, max_position)
    freqs_LD2 = positions.to(torch.float32)[:, None] * inv_freq.to(positions.device)[None, :]
    emb_LD = torch.cat([freqs_LD2, freqs_LD2], dim=-1)
    rd = dtype_of(kp.rope_dtype)
    cos, sin = emb_LD.cos(), emb_LD.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos.to(rd), sin.to(rd)


def apply_rope(
    x_LHD: torch.Tensor, cos_LD: torch.Tensor, sin_LD: torch.Tensor, kp: KernelPolicy
) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` in ``kp.rope_dtype``, rounded back to ``x``'s dtype, by
    the backend the registry names for ``x``'s device (``reference_apply_rope`` is the contract)."""
    return kernel("apply_rope", x_LHD.device)(x_LHD, cos_LD, sin_LD, kp)


def reference_apply_rope(
    x_LHD: torch.Tensor, cos_LD: torch.Tensor, sin_LD: torch.Tensor, kp: KernelPolicy
) -> torch.Tensor:
    """The PyTorch backend of ``apply_rope``: ``x * cos + rotate_half(x) * sin`` in
    ``kp.rope_dtype`` (each product and the sum rounded there), rounded back to ``x``'s dtype."""
    rd = dtype_of(kp.rope_dtype)
    x_r = x_LHD.to(rd)
    half = x_r.shape[-1] // 2
    rot = torch.cat([-x_r[..., half:], x_r[..., :half]], dim=-1)
    out = x_r * cos_LD[:, None, :].to(rd) + rot * sin_LD[:, None, :].to(rd)
    return out.to(x_LHD.dtype)
