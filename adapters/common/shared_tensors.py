"""A name -> tensor dict as one shared-memory buffer, for handing weights to rank processes.

A process started from the multiprocessing fork server (``workers.rank_context`` on CPU) receives
the file descriptors of its arguments through the server's socket, and the server takes at most
a few hundred per process start: torch shares every tensor storage as its own descriptor, so a
28-layer checkpoint (~310 tensors) failed with "too many fds". Packed, a state dict of any size
is one storage and one descriptor, shared (not copied) by every rank that receives it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

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
        index, buffer = cls._allocate((n, t.dtype, tuple(t.shape)) for n, t in tensors.items())
        for (_, _, _, offset, nbytes), t in zip(index, tensors.values(), strict=True):
            _fill(buffer, offset, nbytes, t)
        return cls(buffer, index)

    @classmethod
    def from_safetensors(cls, files: Iterable[str | Path]) -> SharedTensors:
        """The tensors of these safetensors files, in file order, read one tensor at a time
        straight into the shared buffer (shapes and dtypes from the files' headers first): the
        whole state dict is never held anywhere else."""
        from safetensors import safe_open

        files = [str(f) for f in files]
        specs = []
        for f in files:
            with safe_open(f, framework="pt") as h:
                for name in h.keys():
                    part = h.get_slice(name)
                    specs.append(
                        (name, _SAFETENSORS_DTYPES[part.get_dtype()], tuple(part.get_shape()))
                    )
        index, buffer = cls._allocate(specs)
        where = {name: (offset, nbytes) for name, _, _, offset, nbytes in index}
        for f in files:
            with safe_open(f, framework="pt") as h:
                for name in h.keys():
                    _fill(buffer, *where[name], h.get_tensor(name))
        return cls(buffer, index)

    @staticmethod
    def _allocate(specs: Iterable[tuple[str, torch.dtype, tuple[int, ...]]]):
        """``(index, buffer)``: each tensor's aligned place, and an uninitialised shared buffer
        for all of them (allocated in shared memory directly: no private copy to move there)."""
        index, total = [], 0
        for name, dtype, shape in specs:
            total = -(-total // _ALIGN) * _ALIGN
            nbytes = math.prod(shape) * _itemsize(dtype)
            index.append((name, dtype, shape, total, nbytes))
            total += nbytes
        storage = torch.UntypedStorage._new_shared(max(total, 1))
        return tuple(index), torch.empty(0, dtype=torch.uint8).set_(storage)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {
            name: self.buffer[offset : offset + nbytes].view(dtype).view(shape)
            for name, dtype, shape, offset, nbytes in self.index
        }


# safetensors header dtype -> torch dtype
_SAFETENSORS_DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _fill(buffer: torch.Tensor, offset: int, nbytes: int, t: torch.Tensor) -> None:
    """``t``'s bits into its place in ``buffer``: one copy, from wherever ``t`` is (a device
    tensor straight into shared memory, no host staging copy of our own)."""
    if nbytes:
        dst = buffer[offset : offset + nbytes].view(t.dtype).view(t.shape)
        dst.copy_(t.detach())
