"""Planted shared bugs: the parity gate's self-test switches one on in BOTH engines at once.

Both sides compute with these kernels, so a bug here is shared and rollout-vs-trainer parity
cannot see it; the gate must catch it another way (rollout TP=1 vs TP>1, or agreement with
transformers). Every switch is off unless ``contractgen parity --plant-bug NAME`` or
``--inject-faults`` turns it on, inside one process, for one run (``planted``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

BUGS: dict[str, str] = {
    "silu_glu_sign_flip": "silu_glu negates silu(gate) (same bits on every layout)",
    "tp_reduce_skipped": "the TP all-reduce returns this rank's partial (no sum over ranks)",
}

_ACTIVE: set[str] = set()


def active(name: str) -> bool:
    """Whether the planted bug ``name`` is switched on in this process."""
    return name in _ACTIVE


@contextmanager
def planted(names: Iterable[str]) -> Iterator[None]:
    """Switch the named bugs on for the body of the ``with`` (restored in ``finally``)."""
    names = set(names)
    unknown = sorted(names - set(BUGS))
    if unknown:
        raise ValueError(f"unknown planted bug(s) {unknown}; known: {sorted(BUGS)}")
    before = set(_ACTIVE)
    _ACTIVE.update(names)
    try:
        yield
    finally:
        _ACTIVE.clear()
        _ACTIVE.update(before)
