"""Wall time and peak memory of the default parity gate (the budget: < 3 min, < 6 GiB on 2 cores).

Runs ``contractgen parity`` (defaults: v1, tiny reference model, tp1,tp2,pp2,cp2,tp2pp2, CPU) as a
child process and samples the resident memory of its whole process tree (the gate spawns one
process per rank) every 0.2 s. ``/usr/bin/time -v`` alone would report only the largest single
process. Prints a table.

    .venv/bin/python benchmarks/gate_bench.py [-- extra parity args]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def tree_rss_kib(root: int) -> int:
    """Sum of VmRSS over ``root`` and all its descendants (Linux /proc)."""
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
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack.extend(children.get(pid, []))
    return total


def main(argv: list[str]) -> int:
    cmd = [sys.executable, "-m", "contractgen", "parity", "--quiet", *argv]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss_kib(proc.pid))
        time.sleep(0.2)
    wall = time.perf_counter() - t0
    out = proc.stdout.read().decode() if proc.stdout else ""
    print(out)
    print(f"{'command':<12}{' '.join(cmd[1:])}")
    print(f"{'exit':<12}{proc.returncode}")
    print(f"{'wall':<12}{wall:.1f} s   (budget 180 s)")
    print(f"{'peak RSS':<12}{peak / 2**20:.2f} GiB, whole process tree   (budget 6 GiB)")
    print(f"{'machine':<12}{os.cpu_count()} cores")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
