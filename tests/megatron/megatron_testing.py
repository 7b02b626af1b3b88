"""Helpers for building SGLang layers in the current process (tests, notebooks)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from contractgen.adapters.megatron.model import Layout


@contextlib.contextmanager
def single_process_megatron(port: int | None = None) -> Iterator[None]:
    """A one-rank gloo world with megatron-core's model-parallel groups (TP=PP=CP=1)."""
    from contractgen.adapters.common.workers import free_port
    from contractgen.adapters.megatron import runtime

    runtime.init_distributed(0, Layout(), port or free_port())
    try:
        yield
    finally:
        runtime.shutdown()
