"""Helpers for building SGLang layers in the current process (tests, notebooks)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from contractgen.adapters.megatron.model import Layout


@contextlib.contextmanager
def single_process_megatron(port: int | None = None) -> Iterator[None]:
    """A one-rank gloo world with megatron-core's model-parallel groups (TP=PP=CP=1)."""
    from contractgen.adapters.common.distributed import Rendezvous
    from contractgen.adapters.megatron import runtime

    rendezvous = None if port else Rendezvous()  # served here while the rank runs
    runtime.init_distributed(0, Layout(), port or rendezvous.port)
    try:
        yield
    finally:
        runtime.shutdown()
