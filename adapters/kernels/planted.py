"""Planted shared bugs: the parity gate's self-test switches one on in BOTH engines at once.

Both sides compute with these kernels, so a bug here is shared and rollout-vs-trainer parity
cannot see it; the gate must catch it another way (rollout TP=1 vs TP>1, or agreement with
transformers). Every switch is off unless ``contractgen parity --plant-bug NAME`` or
``--inject-faults`` turns it on, inside one process, for one run (``planted``).

``BUGS`` change the forward (the kernels test ``active(name)`` where the bug sits);
``BACKWARD_BUGS`` change only a gradient, so no logprob moves and only a gradient check against
float64 autograd can see them (``--grads``, and ``--train-steps``'s step-0 check). These are
monkeypatches of the kernel library, applied for the body of ``planted`` in the process that
enters it (a spawned rank enters it for its job), and kept out of ``BUGS``, the list
``--inject-faults`` plants and expects a forward check to catch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager

from . import attention

BUGS: dict[str, str] = {
    "silu_glu_sign_flip": "silu_glu negates silu(gate) (same bits on every layout)",
    "tp_reduce_skipped": "the TP all-reduce returns this rank's partial (no sum over ranks)",
}

BACKWARD_BUGS: dict[str, str] = {
    "attention_dk_scale_dropped": "the attention backward's dK misses the softmax scale "
    "(dK = dS^T Q instead of dS^T Q * scale; on every backend)",
    "lora_grad_scale_twice": "the trainer's LoRA backward applies the scale alpha/r twice "
    "(the gradient twin of every adapted linear; the forward keeps the kernel's value)",
}

_ACTIVE: set[str] = set()


def active(name: str) -> bool:
    """Whether the planted bug ``name`` is switched on in this process."""
    return name in _ACTIVE


@contextmanager
def _dk_scale_dropped() -> Iterator[None]:
    """``attention.attention_backward`` (the registry's backend for the device: the PyTorch
    reference or Triton; the trainer looks it up on the module at every call) with dK returned
    without the softmax scale."""
    original = attention.attention_backward

    def attention_backward(q_LHD, *args, scale=None, **kw):
        dq, dk, dv = original(q_LHD, *args, scale=scale, **kw)
        return dq, dk / (q_LHD.shape[-1] ** -0.5 if scale is None else scale), dv

    attention.attention_backward = attention_backward
    try:
        yield
    finally:
        attention.attention_backward = original


# backward bug -> the monkeypatch that plants it
_PATCHES: dict[str, Callable[[], AbstractContextManager[None]]] = {
    "attention_dk_scale_dropped": _dk_scale_dropped,
}


@contextmanager
def planted(names: Iterable[str]) -> Iterator[None]:
    """Switch the named bugs on for the body of the ``with`` (restored in ``finally``)."""
    names = set(names)
    unknown = sorted(names - set(BUGS) - set(BACKWARD_BUGS))
    if unknown:
        known = sorted({*BUGS, *BACKWARD_BUGS})
        raise ValueError(f"unknown planted bug(s) {unknown}; known: {known}")
    before = set(_ACTIVE)
    _ACTIVE.update(names)
    try:
        with ExitStack() as patches:
            for name in sorted((names - before) & set(_PATCHES)):  # nested: patched once
                patches.enter_context(_PATCHES[name]())
            yield
    finally:
        _ACTIVE.clear()
        _ACTIVE.update(before)
