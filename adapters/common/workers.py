"""What the spawned-rank sessions (the rollout's and the trainer's) share: how ranks start, and
reading why a session broke. Standard library only at import.

On CPU, ranks start from a fork server that has imported torch and every target's rank code
once (``rank_context``): a spawned interpreter re-imports them for every rank, seconds of CPU
each, which was most of the cost of starting a session on the tiny models. On CUDA each rank is
a fresh interpreter (``spawn``), as CUDA requires. The fork server is started once per parent
process, with the parent's environment at that moment, so ``start_rank`` hands each rank the
parent's environment as it is when the rank starts (project paths, ``CONTRACTGEN_*`` switches)
and clears what the rank would otherwise inherit from the server's imports (the generated-target
cache).
"""

from __future__ import annotations

import os
import queue
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Imported once, in the fork server; a rank forked from it starts with them loaded. A module
# that does not import (a trainer library absent from a rollout-only machine) is skipped.
# Every registered target's adapter adds its rank modules (its ``PRELOAD``): ``preload()``.
PRELOAD = ("torch", "torch.distributed")


def preload() -> list[str]:
    """What the fork server imports: torch, then every registered target's ``PRELOAD`` (its
    adapter module's heavy rank code), found through the target registry."""
    from contractgen.codegen.targets import registry

    names = list(PRELOAD)
    for target in registry().values():
        if target.adapter:
            names += getattr(target.runtime(), "PRELOAD", ())
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class TrainerJob:
    """What every rank of a trainer session starts from (both trainer targets' sessions)."""

    contract_id: str
    weights: Any  # HF names -> tensors; a ``SharedTensors`` on its way to the ranks
    sequences: list[list[int]]
    layout: Any  # common.layout.Layout
    arch: Any  # common.model.ModelArch
    device: str
    port: int


def free_port() -> int:
    """A TCP port free on this host now (the ranks' rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_context(device: str = "cpu"):
    """The multiprocessing context a session's ranks (and their queues) come from: the fork
    server on CPU; on CUDA a fresh interpreter per rank (``spawn``), since a process forked from
    one that has touched CUDA (importing the rank code may) cannot initialise it again."""
    import torch.multiprocessing as mp

    if device != "cpu":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(preload())
    return ctx


def start_rank(ctx, target: Callable[..., Any], args: tuple, *, daemon: bool = True):
    """Start ``target(*args)`` in a rank process of ``ctx`` under this process's environment."""
    proc = ctx.Process(target=_in_env, args=(dict(os.environ), target, args), daemon=daemon)
    proc.start()
    return proc


def _in_env(env: dict[str, str], target: Callable[..., Any], args: tuple) -> None:
    os.environ.clear()
    os.environ.update(env)
    vendored = sys.modules.get("contractgen.codegen.vendored")
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


class RankPool:
    """``world_size`` rank processes kept alive across commands: the one pool behind the
    rollout's and the trainer's sessions.

    ``target(rank, commands, results, *args)`` runs in each rank (``args`` may be a function
    giving them when the pool starts, e.g. a free port picked just before the ranks bind it): it takes commands from its
    ``commands`` queue until ``None`` and answers each with ``results.put((rank, "ok" | "err",
    payload, ...))``. ``send`` gives every rank one command and returns each rank's reply; a rank
    that dies or a pool that does not answer within ``timeout_s`` closes the pool and raises with
    the tracebacks the ranks sent.
    """

    def __init__(
        self, name: str, world_size: int, target: Callable[..., Any],
        args: tuple | Callable[[], tuple] = (),
        *, device: str = "cpu", timeout_s: float = 900.0,
    ) -> None:  # fmt: skip
        self.name, self.world_size, self.timeout_s = name, world_size, timeout_s
        self.device = device
        self._target, self._args = target, args
        self._procs: list[Any] = []
        self._commands: list[Any] = []
        self._results: Any = None

    @property
    def started(self) -> bool:
        return bool(self._procs)

    def start(self) -> None:
        ctx = rank_context(self.device)
        self._results = ctx.Queue()
        extra = self._args() if callable(self._args) else self._args
        for rank in range(self.world_size):
            commands = ctx.Queue()
            args = (rank, commands, self._results, *extra)
            self._procs.append(start_rank(ctx, self._target, args))
            self._commands.append(commands)

    def send(self, command: Any, what: str) -> dict[int, tuple]:
        """``command`` to every rank (the pool started on first use); ``{rank: (status,
        payload, ...)}``. A rank's ``"err"`` reply raises ``RuntimeError`` naming ``what``."""
        import time

        if not self.started:
            self.start()
        for commands in self._commands:
            commands.put(command)
        replies: dict[int, tuple] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(replies) < self.world_size:
            try:
                rank, status, *payload = self._results.get(timeout=1.0)
            except queue.Empty:
                dead = [i for i, p in enumerate(self._procs) if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    why = f"rank(s) {dead} exited" if dead else f"no reply in {self.timeout_s} s"
                    why += errors_before_exit(replies, self._results)
                    self.close()
                    raise RuntimeError(f"{self.name}: {why}") from None
                continue
            replies[rank] = (status, *payload)
        errors = [f"rank {r}:\n{p[1]}" for r, p in sorted(replies.items()) if p[0] == "err"]
        if errors:
            raise RuntimeError(f"{what} failed\n" + "\n".join(errors))
        return replies

    def close(self) -> None:
        """Ask every rank to stop; kill one that has not within 30 s."""
        for commands in self._commands:
            commands.put(None)
        for proc in self._procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._procs, self._commands = [], []
