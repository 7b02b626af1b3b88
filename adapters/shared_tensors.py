"""A name -> tensor dict as one shared-memory buffer, for handing weights to rank processes.

A process started from the multiprocessing fork server (``workers.rank_context`` on CPU) receives
the file descriptors of its arguments through the server's socket, and the server takes at most
a few hundred per process start: torch shares every tensor storage as its own descriptor, so a
28-layer checkpoint (~310 tensors) failed with "too many fds". Packed, a state dict of any size
is one storage and one descriptor, shared (not copied) by every rank that receives it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

_ALIGN = 64  # bytes: every tensor starts aligned for any element size


@dataclass(frozen=True)
class SharedTensors:
    """``pack`` a state dict; ``tensors()`` gives it back as views of the one buffer (the same
    bits, dtypes and shapes, in the same order). The views share memory with every process
    holding this object: treat them as read-only."""

    buffer: torch.Tensor  # uint8, in shared memory
    index: tuple[tuple[str, torch.dtype, tuple[int, ...], int, int], ...]
    """Per tensor: name, dtype, shape, byte offset, byte length."""

    @classmethod
    def pack(cls, tensors: Mapping[str, torch.Tensor]) -> SharedTensors:
        index, total = [], 0
        for name, t in tensors.items():
            total = -(-total // _ALIGN) * _ALIGN
            nbytes = t.numel() * t.element_size()
            index.append((name, t.dtype, tuple(t.shape), total, nbytes))
            total += nbytes
        buffer = torch.empty(total, dtype=torch.uint8)
        for (_, _, _, offset, nbytes), t in zip(index, tensors.values(), strict=True):
            if nbytes:
                flat = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
                buffer[offset : offset + nbytes].copy_(flat)
        return cls(buffer.share_memory_(), tuple(index))

    def tensors(self) -> dict[str, torch.Tensor]:
        return {
            name: self.buffer[offset : offset + nbytes].view(dtype).view(shape)
            for name, dtype, shape, offset, nbytes in self.index
        }
