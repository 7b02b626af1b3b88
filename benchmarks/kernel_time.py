"""Device time of the kernels a call launches, from the profiler's CUPTI records: the host's work
and the gaps it leaves between launches (a ``.tolist()``, building a block table, a copy from
pageable memory that waits for the stream) do not count. Used by ``tune_attention.py
--kernel-time`` and by ``bench_kernels.py``'s attention table next to its ``do_bench`` column,
which times the whole call."""

from __future__ import annotations

import torch

_L2_BYTES = 256 << 20  # written before each rep: more than the H200's 50 MiB L2
_flush_buffer: dict[torch.device, torch.Tensor] = {}


def flush_l2(device: str | torch.device = "cuda") -> None:
    """Evict every operand from L2, as a real step's earlier layers do."""
    device = torch.device(device)
    if device not in _flush_buffer:
        _flush_buffer[device] = torch.empty(_L2_BYTES // 4, dtype=torch.int32, device=device)
    _flush_buffer[device].zero_()


def kernel_ms(fn, reps: int = 20, flush: bool = True, device: str | torch.device = "cuda") -> float:
    """Milliseconds of device time per call of ``fn``: the summed duration of the kernels it
    launched over ``reps`` calls (an L2 flush before each, its own kernels left out; copies and
    memsets, which the profiler records as device activity too, left out), divided by
    ``reps``."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    def kernels(prof):  # device records but copies and memsets: those are the host's doing
        return [
            e
            for e in prof.events()
            if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))
        ]

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        flush_l2(device)
        torch.cuda.synchronize()
    flush_names = {e.name for e in kernels(prof)}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            if flush:
                flush_l2(device)
            fn()
        torch.cuda.synchronize()
    us = sum(e.time_range.elapsed_us() for e in kernels(prof) if e.name not in flush_names)
    return us / 1e3 / reps
