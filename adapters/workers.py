"""What the spawned-rank sessions (the rollout's and the trainer's) share: reading why a session
broke. Standard library only."""

from __future__ import annotations

import queue
from typing import Any


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
