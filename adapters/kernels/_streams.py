"""Per-stream keys for buffers that kernels reuse across calls."""

from __future__ import annotations

import torch


def stream_key(device: torch.device) -> tuple[torch.device, int]:
    """``(device, current stream)``: work queued on one stream runs in order, so a buffer reused
    only by calls on one stream is never written while an earlier call still reads it."""
    if device.type != "cuda":
        return device, 0
    return device, torch.cuda.current_stream(device).cuda_stream
