"""Give freed heap memory back to the operating system between the gate's phases.

glibc keeps memory that ``free`` returned inside the process (its arenas grow with every large
tensor a phase allocated and shrink only from the top), so after the in-process rollout of a
real-size model the parent still holds gigabytes it no longer uses while the trainer's ranks
allocate their own. ``malloc_trim(0)`` returns every whole free page; where glibc is not the C
library (macOS, musl) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache


@cache
def _libc():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim  # noqa: B018 - glibc only
    except (OSError, AttributeError):
        return None
    return libc


def release_free_memory() -> bool:
    """Return freed heap pages to the OS (glibc ``malloc_trim(0)``); False where unavailable."""
    libc = _libc()
    if libc is None:
        return False
    import gc

    gc.collect()
    return bool(libc.malloc_trim(0))
