"""The floor's one process-group start-up (``adapters/common/distributed.py``) owns its port:
the session serves the rendezvous on a port the OS picked before any rank starts, so many groups
started side by side (as pytest workers and sessions do) never race for one."""

from __future__ import annotations

from contractgen.adapters.common.distributed import Rendezvous, start_process_group
from contractgen.adapters.common.workers import rank_context, start_rank

GROUPS, WORLD = 6, 2


def _rank(rank: int, group: int, port: int, results) -> None:
    import traceback

    import torch
    import torch.distributed as dist

    try:
        start_process_group(rank, WORLD, port, "cpu")
        x = torch.tensor([float(group * 10 + rank)])
        dist.all_reduce(x)  # both ranks of this group, and no other group's
        results.put((group, rank, float(x), None))
        dist.destroy_process_group()
    except Exception:
        results.put((group, rank, None, traceback.format_exc()))


def test_many_groups_start_side_by_side_each_on_its_own_rendezvous():
    ctx = rank_context()
    results = ctx.Queue()
    stores = [Rendezvous() for _ in range(GROUPS)]  # every port bound now, before any rank
    assert len({s.port for s in stores}) == GROUPS
    procs = [
        start_rank(ctx, _rank, (rank, g, stores[g].port, results))
        for g in range(GROUPS)
        for rank in range(WORLD)
    ]
    got = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    errors = [e for *_, e in got if e]
    assert errors == []
    sums = {(g, r): v for g, r, v, _ in got}
    assert sums == {(g, r): float(2 * g * 10 + 1) for g in range(GROUPS) for r in range(WORLD)}


def test_a_port_held_by_another_process_is_never_handed_out():
    """The race the rendezvous closes: a port the OS picked for a store stays bound to it, so a
    second store asking for port 0 gets another one."""
    first, second = Rendezvous(), Rendezvous()
    assert first.port != second.port
