"""By hand on an H200: the vendored kernel module against SGLang's own ``matmul_tp_persistent``.

Not run in CI and imported by no test. It copies nothing of SGLang: the person running it puts
SGLang's kernel file in the ignored ``scratch/`` folder at run time and passes its path.

    .venv/bin/contractgen sync ...   # or render the module as below, with no sibling repo
    .venv/bin/python benchmarks/vendored_kernel_vs_sglang.py \\
        --sglang-kernel scratch/sglang_tp_invariant_ops.py [--vendored PATH] [--json OUT]

``--vendored`` is a synced ``tp_invariant_ops.py``; without it the module is rendered from this
checkout (``kernels = true`` for sglang) into ``scratch/``. Prints, per Qwen3-4B projection
(N x K) and M in 1, 16, 64, 4096, 8192: whether the two outputs are bit-identical, and each
one's median time (``triton.testing.do_bench``, CUDA events).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Qwen3-4B (hidden 2560, 32 q heads and 8 kv heads of 128, intermediate 9728): N x K per projection
SHAPES = [
    ("q_proj", 4096, 2560),
    ("k/v_proj", 1024, 2560),
    ("o_proj", 2560, 4096),
    ("gate/up", 9728, 2560),
    ("down_proj", 2560, 9728),
]
MS = (1, 16, 64, 4096, 8192)


def _import(path: Path, name: str):
    sys.path.insert(0, str(path.parent))  # a kernel file's own imports, and dataclasses' lookup
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _render_vendored(out: Path) -> Path:
    from contractgen.codegen.kernels_module import MODULE_NAME
    from contractgen.codegen.paths import builtin_config
    from contractgen.codegen.render import render_vendored
    from contractgen.schema.loader import load_contracts

    config = dataclasses.replace(builtin_config(), kernels=frozenset({"sglang"}))
    files = render_vendored(load_contracts(config.contracts_dir, config.root), config, "sglang")
    out.mkdir(parents=True, exist_ok=True)
    path = out / MODULE_NAME
    path.write_bytes(files[f"{config.package('sglang')}/{MODULE_NAME}"])
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sglang-kernel", type=Path, required=True,
                        help="SGLang's tp_invariant_ops.py, put in scratch/ by hand")  # fmt: skip
    parser.add_argument("--vendored", type=Path, help="a synced tp_invariant_ops.py")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()

    import torch
    import triton

    if not torch.cuda.is_available():
        print("needs a CUDA GPU (SGLang's kernel reads the SM count of one)", file=sys.stderr)
        return 2
    vendored_path = args.vendored or _render_vendored(ROOT / "scratch" / "vendored_kernels")
    ours = _import(vendored_path, "contractgen_vendored_tp_invariant_ops")
    theirs = _import(args.sglang_kernel.resolve(), "sglang_tp_invariant_ops_scratch")
    rows = []
    print(f"{'shape':<10} {'N x K':>11} {'M':>5}  bits equal  {'ours ms':>8}  {'SGLang ms':>9}  x")
    for name, N, K in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(N + K)
        w_NK = (torch.randn(N, K, device="cuda", generator=g) * K**-0.5).to(torch.bfloat16)
        for M in MS:
            x = torch.randn(M, K, device="cuda", generator=g).to(torch.bfloat16)
            B = w_NK.t()  # as SGLang's linear layers call it
            y_ours = ours.matmul_tp_persistent(x, B)
            y_theirs = theirs.matmul_tp_persistent(x, B)
            equal = torch.equal(y_ours.view(torch.int16), y_theirs.view(torch.int16))
            t_ours = triton.testing.do_bench(lambda x=x, B=B: ours.matmul_tp_persistent(x, B))
            t_theirs = triton.testing.do_bench(lambda x=x, B=B: theirs.matmul_tp_persistent(x, B))
            row = {"shape": name, "N": N, "K": K, "M": M, "bits_equal": equal,
                   "ours_ms": t_ours, "sglang_ms": t_theirs}  # fmt: skip
            rows.append(row)
            print(f"{name:<10} {N:>5} x {K:<5} {M:>5}  {'yes' if equal else 'NO':<10}  "
                  f"{t_ours:8.3f}  {t_theirs:9.3f}  {t_theirs / t_ours:4.2f}", flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    equal = sum(r["bits_equal"] for r in rows)
    print(f"bits equal on {equal}/{len(rows)} cases")
    return 0 if equal == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
