"""Issue 32, the SiLU-GLU backward and the small ops' copies, in one process: the fused Triton
backward (``fused_silu_glu_backward``, one launch) against the float32 chain it replaces
(``torch_silu_glu_backward``) and the chain before 733c406 (``test_backward_widening``'s
legacy copy): bits (mismatched elements, 0 expected on CUDA) and median time. Then the forwards
that now read strided rows against the old ``.contiguous()`` copy plus the kernel: SiLU-GLU on
the fc1 halves and the k-heads' QK-norm on megatron's fused-QKV split. Operands are those of the
Qwen3-0.6B trainer at 32 x 512 tokens (T = 16384, intermediate 3072, 8 kv groups x 2 q heads x
128), bf16.

    python3 benchmarks/diag_silu_glu_backward.py --json $OUT/silu_glu_backward.json
    TRITON_INTERPRET=1 python3 benchmarks/diag_silu_glu_backward.py --tokens 64 --inter 96  # CPU
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def _legacy_silu_glu_backward():
    path = HERE.parent / "tests" / "kernels" / "test_backward_widening.py"
    spec = importlib.util.spec_from_file_location("legacy_backward", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._legacy_silu_glu_backward


def _ms(fn, dev: torch.device) -> float:
    """Median milliseconds of ``fn()``: ``triton.testing.do_bench`` on CUDA, wall time else."""
    if dev.type == "cuda":
        import triton.testing

        return triton.testing.do_bench(fn, return_mode="median")
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def _mismatched(a: tuple, b: tuple) -> int:
    ints = {2: torch.int16, 4: torch.int32}
    return sum(
        int((x.contiguous().view(ints[x.element_size()]) != y.contiguous().view(ints[y.element_size()])).sum())
        for x, y in zip(a, b, strict=True)
    )  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--inter", type=int, default=3072, help="MLP intermediate size")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from contractgen.adapters.kernels.triton import mlp as tmlp
    from contractgen.adapters.kernels.triton import norm as tnorm
    from contractgen.codegen.vendored import load_target

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kp = load_target("sglang").schema.kernel_policy_for("qwen3_dense_true_on_policy_v3")
    t, f = args.tokens, args.inter
    g = torch.Generator(device=dev).manual_seed(0)
    fc1 = (torch.randn(t, 2 * f, device=dev, generator=g) * 3).to(torch.bfloat16)
    gate, up = torch.chunk(fc1, 2, dim=-1)  # the trainer's strided halves
    dy = torch.randn(t, f, device=dev, generator=g).to(torch.bfloat16)
    legacy = _legacy_silu_glu_backward()
    rows = []

    def row(**kw):
        rows.append(kw)
        print(json.dumps(kw), flush=True)

    fused = tmlp.fused_silu_glu_backward(gate, up, dy)
    chain = tmlp.torch_silu_glu_backward(gate, up, dy)
    row(op="silu_glu_backward bits", shape=[t, f], device=str(dev),
        fused_vs_chain_mismatched=_mismatched(fused, chain),
        fused_vs_legacy_mismatched=_mismatched(fused, legacy(gate, up, dy)),
        elements=2 * t * f)  # fmt: skip
    del fused, chain
    for _ in range(2):  # alternate, so drift hits all three
        row(op="silu_glu_backward ms", shape=[t, f],
            legacy_chain=_ms(lambda: legacy(gate, up, dy), dev),
            chain=_ms(lambda: tmlp.torch_silu_glu_backward(gate, up, dy), dev),
            fused=_ms(lambda: tmlp.fused_silu_glu_backward(gate, up, dy), dev))  # fmt: skip

    new_y = tmlp._forward(gate, up)
    old_y = tmlp._forward(gate.contiguous(), up.contiguous())
    row(op="silu_glu forward", shape=[t, f], mismatched=_mismatched((new_y,), (old_y,)),
        copies_then_kernel_ms=_ms(lambda: tmlp._forward(gate.contiguous(), up.contiguous()), dev),
        strided_kernel_ms=_ms(lambda: tmlp._forward(gate, up), dev))  # fmt: skip

    groups, rep, hn = 8, 2, 128  # Qwen3-0.6B: 16 q heads, 8 kv heads, head dim 128
    mixed = (torch.randn(t, groups, (rep + 2) * hn, device=dev, generator=g)).to(torch.bfloat16)
    k = mixed[..., rep * hn : (rep + 1) * hn]
    w = (torch.randn(hn, device=dev, generator=g) * 0.2 + 1).to(torch.bfloat16)

    def norm(x):
        return tnorm.triton_rms_norm(x, w, 1e-6, kp)

    row(op="k-head QK-norm forward", shape=[t, groups, hn],
        mismatched=_mismatched((norm(k),), (norm(k.contiguous()),)),
        copy_then_kernel_ms=_ms(lambda: norm(k.contiguous()), dev),
        strided_kernel_ms=_ms(lambda: norm(k), dev))  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    bad = [r for r in rows if any(v for k_, v in r.items() if "mismatched" in k_)]
    return 1 if dev.type == "cuda" and bad else 0


if __name__ == "__main__":
    sys.exit(main())
