"""What the spawned-rank sessions (the rollout's and the trainer's) share: how ranks start, and
reading why a session broke. Standard library only at import.

Ranks start from a fork server that has imported torch, megatron-core and the rank code once
(``rank_context``): a spawned interpreter re-imports them for every rank, several seconds of CPU
each, which was most of the cost of starting a session on the tiny models. The fork server is
started once per parent process, with the parent's environment at that moment, so
``start_rank`` hands each rank the parent's environment as it is when the rank starts (project
paths, ``CONTRACTGEN_*`` switches) and clears what the rank would otherwise inherit from the
server's imports (the generated-target cache).
"""

from __future__ import annotations

import os
import queue
import sys
from collections.abc import Callable
from typing import Any

# Imported once, in the fork server; a rank forked from it starts with them loaded. A module
# that does not import (no megatron-core on a rollout-only machine) is skipped by the server.
PRELOAD = (
    "torch",
    "torch.distributed",
    "megatron.core.models.gpt",
    "megatron.core.optimizer",
    "contractgen.adapters.megatron.runtime",
    "contractgen.parity.rollout",
)


def rank_context():
    """The multiprocessing context every session's ranks (and their queues) come from."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def start_rank(ctx, target: Callable[..., Any], args: tuple, *, daemon: bool = True):
    """Start ``target(*args)`` in a rank process of ``ctx`` under this process's environment."""
    proc = ctx.Process(target=_in_env, args=(dict(os.environ), target, args), daemon=daemon)
    proc.start()
    return proc


def _in_env(env: dict[str, str], target: Callable[..., Any], args: tuple) -> None:
    os.environ.clear()
    os.environ.update(env)
    vendored = sys.modules.get("contractgen.vendored")
    if vendored is not None:  # read the generated targets of this environment's project
        vendored.load_target.cache_clear()
    target(*args)


def errors_before_exit(replies: dict[int, tuple], results: Any) -> str:
    """The tracebacks ranks sent before a rank exited: those already received (``replies``:
    rank -> (status, payload, ...)) and any still queued on ``results``. A rank that fails puts
    its traceback on the queue before it exits, so this is usually why the others hung."""
    pending = dict(replies)
    while True:
        try:
            rank, status, payload, *_ = results.get_nowait()
        except (queue.Empty, OSError, EOFError, ValueError):
            break
        pending[rank] = (status, payload)
    errors = [f"rank {r}:\n{p[1]}" for r, p in sorted(pending.items()) if p[0] == "err"]
    return "\n" + "\n".join(errors) if errors else ""
