"""Tree all-reduce (the contract's fixed order) vs NCCL ``all_reduce``, bf16, one process per GPU.

    python3 benchmarks/bench_allreduce.py --world 2 --json $OUT/allreduce.json

Per size: median time of each over ``--reps`` calls (CUDA events), and whether every rank got the
same bits and they equal the local ``tree_sum`` of the gathered inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SIZES_KIB = [64, 256, 1024, 4096, 16384, 65536]


def _time_ms(fn, reps: int) -> float:
    ts = []
    for _ in range(3):
        fn()
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def _worker(rank: int, world: int, reps: int, json_path: str | None) -> None:
    from contractgen.adapters.kernels.all_reduce import tree_all_reduce, tree_sum

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank)
    )
    rows = []
    for kib in SIZES_KIB:
        n = kib * 1024 // 2
        g = torch.Generator(device="cuda").manual_seed(rank)
        x = torch.randn(n, generator=g, device="cuda").to(torch.bfloat16)
        y = tree_all_reduce(x)
        allx = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(allx, x)
        ally = [torch.empty_like(y) for _ in range(world)]
        dist.all_gather(ally, y)
        same = all(torch.equal(ally[0], o) for o in ally) and torch.equal(y, tree_sum(allx))
        tree_ms = _time_ms(lambda x=x: tree_all_reduce(x), reps)
        nccl_ms = _time_ms(lambda x=x: dist.all_reduce(x.clone()), reps)
        clone_ms = _time_ms(lambda x=x: x.clone(), reps)
        rows.append({"KiB": kib, "tree_ms": tree_ms, "nccl_ms": nccl_ms - clone_ms,
                     "ratio": tree_ms / max(nccl_ms - clone_ms, 1e-6), "same_bits": same})  # fmt: skip
    if rank == 0:
        print(f"{'size KiB':>9}{'tree ms':>10}{'NCCL ms':>10}{'x':>7}{'bits':>6}")
        for r in rows:
            print(f"{r['KiB']:>9}{r['tree_ms']:>10.4f}{r['nccl_ms']:>10.4f}{r['ratio']:>7.2f}"
                  f"{str(r['same_bits'])[0]:>6}")  # fmt: skip
        if json_path:
            with open(json_path, "w") as f:
                json.dump({"world": world, "device": torch.cuda.get_device_name(0),
                           "torch": torch.__version__, "rows": rows}, f, indent=1)  # fmt: skip
    dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    mp.spawn(_worker, args=(args.world, args.reps, args.json), nprocs=args.world)
    return 0


if __name__ == "__main__":
    sys.exit(main())
