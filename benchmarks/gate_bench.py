"""Wall time and peak memory of the default parity gate (the budget: < 3 min, < 6 GiB on 2 cores).

Runs ``contractgen parity`` (defaults: v1, tiny reference model, tp1,tp2,pp2,cp2,tp2pp2, CPU) as a
child process and samples the resident memory of its whole process tree (the gate spawns one
process per rank) every 0.2 s, two ways: the sum of every process's RSS (pages shared between
processes, such as the trainer's weight buffer mapped in the parent and in a rank, counted once
per process) and the sum of PSS (``/proc/PID/smaps_rollup``: each shared page split among the
processes mapping it, so the tree's pages count once). ``/usr/bin/time -v`` alone would report
only the largest single process. Prints a table.

    .venv/bin/python benchmarks/gate_bench.py [-- extra parity args]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:  # the process ended between the listing and the read
        pass
    return 0


def tree_memory_kib(root: int) -> tuple[int, int]:
    """``(sum of VmRSS, sum of PSS)`` over ``root`` and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        pid, ppid = int(entry.name), int(fields["PPid"].strip())
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields.get("VmRSS", "0 kB").split()[0])
    total, pss, stack = 0, 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        pss += _pss_kib(pid)
        stack.extend(children.get(pid, []))
    return total, pss


def main(argv: list[str]) -> int:
    cmd = [sys.executable, "-m", "contractgen", "parity", "--quiet", *argv]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    peak = peak_pss = 0
    while proc.poll() is None:
        rss, pss = tree_memory_kib(proc.pid)
        peak, peak_pss = max(peak, rss), max(peak_pss, pss)
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    out = proc.stdout.read().decode() if proc.stdout else ""
    print(out)
    print(f"{'command':<12}{' '.join(cmd[1:])}")
    print(f"{'exit':<12}{proc.returncode}")
    print(f"{'wall':<12}{wall:.1f} s   (budget 180 s)")
    print(f"{'peak RSS':<12}{peak / 2**20:.2f} GiB, sum over the process tree   (budget 6 GiB)")
    print(
        f"{'peak PSS':<12}{peak_pss / 2**20:.2f} GiB, sum over the process tree (shared pages once)"
    )
    print(f"{'machine':<12}{os.cpu_count()} cores")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
