"""The one process-group start-up of every target's ranks, with no port race.

A port picked free and closed (``workers.free_port``) can be taken by another process before the
rank meant to serve the rendezvous binds it (a full test run once failed so: ``EADDRINUSE`` in
rank 0's ``TCPStore``). Here the session's own process serves the store (``Rendezvous``), bound
to a port the OS picks (port 0) before any rank starts, and kept while the ranks run; every rank
joins it as a client (``start_process_group``), so no port is ever free between pick and bind.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from .run_types import BACKENDS

HOST = "127.0.0.1"
TIMEOUT = timedelta(seconds=300)


class Rendezvous:
    """A TCP store served by this process on a port the OS picked; ``port`` is what the ranks
    join. Keep it while the ranks run (its server lives with the object); one per start of a
    rank pool (a store is not reused: its keys belong to one process group)."""

    def __init__(self) -> None:
        self.store = dist.TCPStore(
            HOST, 0, None, is_master=True, timeout=TIMEOUT, wait_for_workers=False
        )
        self.port = int(self.store.port)


def start_process_group(rank: int, world_size: int, port: int, device: str) -> None:
    """This rank's default process group (gloo on CPU, NCCL on CUDA: one GPU per rank), joined
    through the ``Rendezvous`` served on ``port``."""
    if device not in BACKENDS:
        raise ValueError(f"device={device!r}: expected one of {sorted(BACKENDS)}")
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = HOST, str(port)
    if device == "cuda":
        torch.cuda.set_device(rank)
    store = dist.TCPStore(HOST, port, None, is_master=False, timeout=TIMEOUT)
    dist.init_process_group(BACKENDS[device], store=store, rank=rank, world_size=world_size)
