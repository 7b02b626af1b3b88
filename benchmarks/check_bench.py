"""Wall time of the whole ``contractgen check`` process: shipped contracts and N synthetic ones.

    .venv/bin/python benchmarks/check_bench.py [--runs 7] [--synthetic 100] [--strict]

The synthetic contracts are copies of the shipped v1 with new ids and families, written to a
temporary project (contractgen.toml, contracts/, generated/ from one untimed ``generate``). Each
case is run once to warm the file cache, then timed ``--runs`` times from process start to exit.
Targets (issue 2): under 1 s for the shipped contracts, under 3 s for 100 synthetic ones.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
V1 = ROOT / "contracts" / "qwen3_dense_true_on_policy_v1.yaml"


def contractgen_command() -> list[str]:
    script = Path(sys.executable).with_name("contractgen")
    return [str(script)] if script.exists() else [sys.executable, "-m", "contractgen"]


def make_synthetic(root: Path, count: int) -> None:
    """``count`` copies of v1 with ids ``synth_NNN_true_on_policy_v1`` and ten families."""
    (root / "contractgen.toml").write_text("")
    folder = root / "contracts"
    folder.mkdir()
    text = V1.read_text()
    for i in range(count):
        cid = f"synth_{i:03d}_true_on_policy_v1"
        body = text.replace("id: qwen3_dense_true_on_policy_v1", f"id: {cid}", 1)
        body = body.replace("family: qwen3_dense", f"family: synth_family_{i % 10}", 1)
        (folder / f"{cid}.yaml").write_text(body)
    subprocess.run([*contractgen_command(), "--root", str(root), "generate"], check=True,
                   capture_output=True)  # fmt: skip


def time_check(root: Path, runs: int) -> list[float]:
    cmd = [*contractgen_command(), "--root", str(root), "check"]
    subprocess.run(cmd, check=True, capture_output=True)  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown"
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return match.group(1).strip() if match else "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--synthetic", type=int, default=100)
    parser.add_argument(
        "--strict", action="store_true", help="exit 1 if a median misses its target"
    )
    args = parser.parse_args()

    shipped = len(list((ROOT / "contracts").glob("*.yaml")))
    rows = [("shipped", shipped, time_check(ROOT, args.runs), 1.0)]
    with tempfile.TemporaryDirectory(prefix="contractgen-bench-") as tmp:
        make_synthetic(Path(tmp), args.synthetic)
        rows.append(("synthetic", args.synthetic, time_check(Path(tmp), args.runs), 3.0))

    print(
        f"machine: {os.cpu_count()} CPUs (nproc), {cpu_model()}; Python {platform.python_version()}"
    )
    print(f"command: {' '.join(contractgen_command())} --root <project> check  ({args.runs} runs)")
    print()
    print("| case | contracts | median (s) | min (s) | max (s) | target (s) | met |")
    print("|---|---:|---:|---:|---:|---:|---|")
    missed = False
    for name, count, times, target in rows:
        median = statistics.median(times)
        met = median < target
        missed |= not met
        print(f"| {name} | {count} | {median:.3f} | {min(times):.3f} | {max(times):.3f} | "
              f"< {target:g} | {'yes' if met else 'NO'} |")  # fmt: skip
    return 1 if (missed and args.strict) else 0


if __name__ == "__main__":
    sys.exit(main())
