"""Compile every Triton kernel for an H100/H200 (sm_90) down to a cubin, on a machine without a
GPU: Triton's front end, its GPU passes and ptxas (shipped in the triton wheel) all run on the
host. The interpreter (CI's other way to run the kernels) accepts code the compiler rejects,
such as a kernel reading a global that is not a ``tl.constexpr``; this catches that before a GPU
does. Run as a script without ``TRITON_INTERPRET`` (``test_triton_compiles.py`` does); prints one
line per kernel and exits 1 on the first that fails. ``--resources`` adds each kernel's shared
memory, registers per thread and spills (ptxas's own report): what bounds programs per SM.
``--count INSTR[,INSTR...]`` adds how many times the PTX names each instruction (e.g.
``fma.rn.f32``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("gpu_compile.py compiles the real kernels: run it without TRITON_INTERPRET=1")

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

from contractgen.adapters.kernels.triton import (
    attention,
    attention_bwd,
    logsoftmax,
    matmul,
    mlp,
    norm,
    rope,
    tree_sum,
)

TARGET = GPUTarget("cuda", 90, 32)
# pointer arguments by name (every kernel names them ``*_ptr``); the rest are bf16 tensors
POINTERS = {"lse_ptr": "*fp32", "delta_ptr": "*fp32", "pos_ptr": "*i32", "blk_ptr": "*i32",
            "count_ptr": "*i32", "r_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32",
            "m_ptr": "*fp32", "s_ptr": "*fp32", "logits_ptr": "*fp32",
            "idx_ptr": "*i64", "owned_ptr": "*i8", "g_ptr": "*fp32", "grad_ptr": "*fp32"}  # fmt: skip
FLOATS = {"scale", "scale2", "inv_n", "eps"}


def signature(fn, constexprs: dict, descriptors: dict | None = None) -> dict:
    """Triton's signature of ``fn``: ``*_ptr`` arguments are pointers, ``*_desc`` TMA descriptors
    (``descriptors`` gives each one's block shape), ``scale`` and ``scale2`` float32, the other runtime
    arguments int32; ``constexprs`` name the compile-time ones."""
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_desc"):
            sig[name] = f"tensordesc<bf16{list(descriptors[name])}>"
        elif name.endswith("_ptr"):
            sig[name] = POINTERS.get(name, "*bf16")
        else:
            sig[name] = "fp32" if name in FLOATS else "i32"
    return sig


def aligned(fn, sig: dict) -> dict:
    """Triton's specialization of a real launch: torch's allocations are 16-byte aligned and the
    sizes and strides of the shapes we run are multiples of 16. Without it the compiler cannot
    vectorize the loads, and it does not pipeline them: the code would not be the code that runs."""
    return {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(fn.arg_names)
        if sig[name] not in ("constexpr", "fp32") and not sig[name].startswith("tensordesc")
    }


def cases():
    """(label, kernel, constexprs, launch options[, descriptor block shapes]): the shapes the host
    code launches."""
    mm = matmul.PERSISTENT
    for even_k in (True, False):
        yield (
            f"_mm_persistent even_k={even_k}", matmul._mm_persistent,
            dict(RUN=2, NUM_RUNS=16, ACC=tl.bfloat16, NUM_PROGS=264, ITERS=4, BLOCK_M=mm.block_m,
                 BLOCK_N=mm.block_n, BLOCK_K=128, GROUP_M=matmul.GROUP_M, EVEN_K=even_k,
                 TMA=False, FUSED=False, OUT=tl.bfloat16, x_desc=None, w_desc=None),
            dict(num_warps=mm.num_warps, num_stages=mm.num_stages),
        )  # fmt: skip
    for tma, run, runs in ((matmul.PERSISTENT, 2, 16),
                           (matmul.PERSISTENT_DEEP, 2, 32),
                           (matmul.PERSISTENT_LARGE, 5, matmul.LARGE_MAX_RUNS)):  # fmt: skip
        yield (
            f"_mm_persistent tma {tma.block_m}x{tma.block_n} runs={runs}", matmul._mm_persistent,
            dict(RUN=run, NUM_RUNS=runs, ACC=tl.bfloat16, NUM_PROGS=264, ITERS=4,
                 BLOCK_M=tma.block_m, BLOCK_N=tma.block_n, BLOCK_K=128, GROUP_M=matmul.GROUP_M,
                 EVEN_K=True, TMA=True, FUSED=False, OUT=tl.bfloat16, x_ptr=None,
                 w_ptr=None),
            dict(num_warps=tma.num_warps, num_stages=tma.num_stages),
            dict(x_desc=(tma.block_m, 128), w_desc=(tma.block_n, 128)),
        )  # fmt: skip
    # fixed_runs (v3): 8 fused runs of one tile (K = 512) and of five (K = 2560), 64-wide tiles
    for run in (1, 5):
        for mm in (matmul.PERSISTENT_FUSED, matmul.PERSISTENT_FUSED_NARROW):
            yield (
                f"_mm_persistent fused tma {mm.block_m}x{mm.block_n} run={run}",
                matmul._mm_persistent,
                dict(RUN=run, NUM_RUNS=8, ACC=tl.float32, NUM_PROGS=264, ITERS=4,
                     BLOCK_M=mm.block_m, BLOCK_N=mm.block_n, BLOCK_K=64, GROUP_M=matmul.GROUP_M,
                     EVEN_K=True, TMA=True, FUSED=True, OUT=tl.bfloat16, x_ptr=None,
                     w_ptr=None),
                dict(num_warps=mm.num_warps, num_stages=mm.num_stages),
                dict(x_desc=(mm.block_m, 64), w_desc=(mm.block_n, 64)),
            )  # fmt: skip
        # one run over all of K (matmul_column_k_runs: 1): K = 512 and 2560
        for mm in (
            matmul.PERSISTENT_FUSED_ONE_RUN,
            matmul.PERSISTENT_FUSED_ONE_RUN_SMALL_M,
            matmul.PERSISTENT_FUSED_NARROW,
        ):
            yield (
                f"_mm_persistent fused tma {mm.block_m}x{mm.block_n} one run of {8 * run}",
                matmul._mm_persistent,
                dict(RUN=8 * run, NUM_RUNS=1, ACC=tl.float32, NUM_PROGS=132, ITERS=4,
                     BLOCK_M=mm.block_m, BLOCK_N=mm.block_n, BLOCK_K=64, GROUP_M=matmul.GROUP_M,
                     EVEN_K=True, TMA=True, FUSED=True, OUT=tl.bfloat16, x_ptr=None,
                     w_ptr=None),
                dict(num_warps=mm.num_warps, num_stages=mm.num_stages),
                dict(x_desc=(mm.block_m, 64), w_desc=(mm.block_n, 64)),
            )  # fmt: skip
        shape = matmul.small_shape(1, 8, fused=True)
        yield (
            f"_mm_runs fused {shape.block_m}x{shape.block_n} group={shape.runs_per_program} "
            f"run={run}", matmul._mm_runs,
            dict(RUN=run, NUM_RUNS=8, ACC=tl.float32, BLOCK_M=shape.block_m,
                 BLOCK_N=shape.block_n, BLOCK_K=64, EVEN_K=True, GROUP=shape.runs_per_program,
                 FUSED=True, OUT=tl.bfloat16),
            dict(num_warps=shape.num_warps, num_stages=shape.num_stages),
        )  # fmt: skip
    for shape, run, runs in ((matmul.small_shape(1, 4), 5, 4), (matmul.small_shape(64, 4), 5, 4),
                             (matmul.small_shape(64, 16), 2, 16)):  # fmt: skip
        group = shape.runs_per_program
        yield (
            f"_mm_runs {shape.block_m}x{shape.block_n} group={group}", matmul._mm_runs,
            dict(RUN=run, NUM_RUNS=runs, ACC=tl.bfloat16, BLOCK_M=shape.block_m,
                 BLOCK_N=shape.block_n, BLOCK_K=128, EVEN_K=True, GROUP=group, FUSED=False,
                 OUT=tl.bfloat16),
            dict(num_warps=shape.num_warps, num_stages=shape.num_stages),
        )  # fmt: skip
    # fixed_runs with bf16 runs (what the gate's fault injection flips) stored as float32
    # (``out_dtype=float32``): the epilogue widens the bf16 sum instead of rounding
    shape = matmul.small_shape(4, 8, fused=True)
    yield (
        "_mm_runs fused acc=bf16 out=fp32", matmul._mm_runs,
        dict(RUN=3, NUM_RUNS=8, ACC=tl.bfloat16, BLOCK_M=shape.block_m, BLOCK_N=shape.block_n,
             BLOCK_K=64, EVEN_K=True, GROUP=shape.runs_per_program, FUSED=True, OUT=tl.float32),
        dict(num_warps=shape.num_warps, num_stages=shape.num_stages),
    )  # fmt: skip
    mm = matmul.PERSISTENT_FUSED_NARROW
    yield (
        "_mm_persistent fused tma acc=bf16 out=fp32", matmul._mm_persistent,
        dict(RUN=3, NUM_RUNS=8, ACC=tl.bfloat16, NUM_PROGS=264, ITERS=4, BLOCK_M=mm.block_m,
             BLOCK_N=mm.block_n, BLOCK_K=64, GROUP_M=matmul.GROUP_M, EVEN_K=True, TMA=True,
             FUSED=True, OUT=tl.float32, x_ptr=None, w_ptr=None),
        dict(num_warps=mm.num_warps, num_stages=mm.num_stages),
        dict(x_desc=(mm.block_m, 64), w_desc=(mm.block_n, 64)),
    )  # fmt: skip
    for group, rows, warps in ((1, attention.BLOCK_Q, attention.NUM_WARPS),
                               (4, attention.BLOCK_Q, attention.NUM_WARPS),
                               (3, attention.BLOCK_Q, attention.NUM_WARPS)):  # fmt: skip
        for tma in (False, True):
            yield (
                f"_attn_fwd group={group} rows={rows} warps={warps}" + (" tma" if tma else ""),
                attention._attn_fwd,
                dict(REP=4 if group != 3 else 3, GROUP=group, CHUNK=64, D=128,
                     BLOCK_Q=rows, MAX_CHUNKS=64, WHOLE=attention.WHOLE_CHUNKS,
                     TMA=tma, **({} if tma else {"k_desc": None, "v_desc": None})),
                dict(num_warps=warps, num_stages=attention.NUM_STAGES),
                *([dict(k_desc=(64, 128), v_desc=(64, 128))] if tma else []),
            )  # fmt: skip
    for fn, cfg, bound in ((attention_bwd._attn_bwd_dkdv, attention_bwd.DKDV, "MAX_QBLOCKS"),
                           (attention_bwd._attn_bwd_dq, attention_bwd.DQ, "MAX_KBLOCKS")):  # fmt: skip
        yield (
            fn.__name__, fn,
            dict(REP=4, D=128, BLOCK_Q=cfg["BLOCK_Q"], BLOCK_K=cfg["BLOCK_K"], **{bound: 64}),
            dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"]),
        )  # fmt: skip
    yield (
        "_attn_bwd_delta", attention_bwd._attn_bwd_delta,
        dict(H=32, D=128, BLOCK=attention_bwd.DELTA_ROWS), {},
    )  # fmt: skip
    # the decode step's small ops (one kernel each instead of the reference's many launches)
    for recip in (True, False):
        for cbw in (True, False):
            yield (
                f"_rms_norm_fwd n=1024 reciprocal={recip} cast_before_weight={cbw}",
                norm._rms_norm_fwd,
                dict(RECIPROCAL=recip, CAST_BEFORE_WEIGHT=cbw, BLOCK_R=1, CH=32, LOG2CH=5, C=32,
                     LOG2C=5),
                dict(num_warps=1),
            )  # fmt: skip
    yield (
        "_rope_fwd d=128", rope._rope_fwd, dict(HALF=64, BLOCK_H=16, BLOCK_HALF=64),
        dict(num_warps=2),
    )  # fmt: skip
    for fn in (mlp._silu_glu_fwd, mlp._silu_glu_bwd):  # rows of 1024 and more: one a tile
        yield fn.__name__, fn, dict(BLOCK_R=1, BLOCK_N=mlp.ELEMENTS), dict(num_warps=4)
    yield (
        "_chunk_sums_fwd block=128", logsoftmax._chunk_sums_fwd,
        dict(BLOCK=128, LOG2B=7, CPP=logsoftmax.CHUNKS_PER_PROGRAM), dict(num_warps=4),
    )  # fmt: skip
    yield (
        "_logprob_bwd", logsoftmax._logprob_bwd, dict(BLOCK=logsoftmax.BACKWARD_BLOCK),
        dict(num_warps=4),
    )  # fmt: skip
    for n in tree_sum.SIZES:
        yield (
            f"_tree_sum_kernel n={n}", tree_sum._tree_sum_kernel,
            dict(N=n, DT=tl.bfloat16, BLOCK=tree_sum.BLOCK), {},
        )  # fmt: skip


def resources(ptx: str) -> str:
    """Registers per thread and spill bytes, as ptxas reports them for ``ptx``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        out = subprocess.run(
            [get_ptxas(90).path, "-arch=sm_90a", "-v", path, "-o", os.devnull],
            capture_output=True, text=True, check=True,
        ).stderr  # fmt: skip
    regs = re.search(r"Used (\d+) registers", out)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    return f"{regs.group(1)} registers, spills {spill.group(1)}/{spill.group(2)} B st/ld"


def main(argv: list[str]) -> int:
    report = "--resources" in argv
    count = argv[argv.index("--count") + 1] if "--count" in argv else None
    for label, fn, constexprs, options, *desc in cases():
        sig = signature(fn, constexprs, desc[0] if desc else None)
        src = ASTSource(fn, sig, constexprs=constexprs, attrs=aligned(fn, sig))
        try:
            compiled = triton.compile(src, target=TARGET, options=options)
        except Exception as exc:  # the first line names the kernel; the compiler says why
            print(f"FAIL {label}: {type(exc).__name__}: {exc}", flush=True)
            return 1
        line = f"ok   {label}: {len(compiled.asm['cubin'])} bytes of sm_90 cubin"
        if report:
            line += f", {compiled.metadata.shared} B shared, {resources(compiled.asm['ptx'])}"
        for instr in count.split(",") if count else ():
            line += f", {compiled.asm['ptx'].count(instr)} x {instr}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
