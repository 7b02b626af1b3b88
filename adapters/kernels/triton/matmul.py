"""Triton invariant matmul: ``y_MN = x_MK @ w_NK.T`` in the contract's tile order.

Per ``BLOCK_M x BLOCK_N`` output tile: every ``k_block``-wide K tile is one ``tl.dot`` of bf16
operands with float32 accumulation (what SGLang's ``matmul_tp_persistent`` and a per-tile
``torch.mm(..., out_dtype=float32)`` compute), rounded to the accumulation dtype; the tiles of a
first-level run are added one after another, and finished runs are combined by a binary counter
(adjacent pairwise, an odd leftover carried, as ``matmul.pairwise_sum``). Every add is float32 of
the two rounded values, rounded again, as torch's bf16 add. Under ``fixed_runs`` (``FUSED``) a
run's tiles accumulate in the dot's own float32 accumulator (``tl.dot(a, b, acc)``), the runs
are unrolled at compile time (``_runs_tree``), the counter adds float32 runs with an opaque
``add.rn.f32`` (``_ieee_add`` says why), and the sum is rounded once to the output dtype in the
epilogue.

Invariances: each output element's arithmetic (its K tiles, their dots, the order) never changes
with M, N, the call or the launch shape, so a row's bits depend on that row and its column's
weights only (batch and N invariance) and a rank holding a whole subtree of runs computes that
subtree (TP). The launch shape (``LaunchShape``: output tile, warps, stages, programs per SM,
runs per program) is free for speed as long as the tile dot stays the same instruction and the
compiler compiles it right: ``benchmarks/tune_matmul.py`` checks every shape's bits against the
shipped one before timing it. One shape that is not shipped failed that check on an H200 (a
persistent 64 x 64 tile with 8 warps and pointer loads, one run: BENCHMARKS.md, not diagnosed;
``test_triton_matmul_eight_warp_64_tile_is_wrong_on_one_run`` pins it).
Two launches, same arithmetic per output:

* ``_mm_persistent`` (large M): ``programs_per_sm`` programs per SM, each looping over output
  tiles, every K tile of a tile in one pipelined loop; the operand tiles come through TMA
  descriptors (the shipped path, where they fit) or pointer loads, and the output tile follows
  the counter's depth (``persistent_shape``).
* ``_mm_runs`` (small M: where output tiles alone cannot fill the GPU, and every call of at
  most ``SMALL_ROWS`` rows whose K holds more than one run): one program per (output tile, run)
  or per (output tile, a power-of-two group of adjacent runs: a subtree of the counter), so each
  weight is read once; a program writes its sum to a workspace and the last program of a tile to
  finish (an atomic counter per tile) combines them in the fixed order. One launch: no extra
  kernel per tree level.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from .._dtypes import dtype_of
from .._streams import stream_key
from ..matmul import reference_matmul
from ..policy import KernelPolicy
from ..tile_runs import _run_length, fixed_run_width
from .arith import (
    _TL,
    INTERPRET,
    _add,
    _ieee_add,
    _ieee_mul,
    _round,
    _to_out,
    interpreter_dot,
)
from .matmul_kernels import _group_sum, _mm_persistent, _mm_runs, _mm_tile, _tile_coords
from .matmul_shapes import (
    DEEP_FROM_RUNS,
    GROUP_FROM_RUNS,
    GROUP_M,
    LARGE_MAX_RUNS,
    LARGE_WAVES,
    ONE_RUN_FILL,
    ONE_RUN_SMALL_ROWS,
    PERSISTENT,
    PERSISTENT_DEEP,
    PERSISTENT_FUSED,
    PERSISTENT_FUSED_NARROW,
    PERSISTENT_FUSED_ONE_RUN,
    PERSISTENT_FUSED_ONE_RUN_SMALL_M,
    PERSISTENT_LARGE,
    PERSISTENT_POINTER,
    SMALL_FUSED,
    SMALL_M,
    SMALL_M_WIDE,
    SMALL_ROWS,
    LaunchShape,
    persistent_shape_for_fused,
    small_shape,
)
from .matmul_tiles import _push, _run, _runs_tree, _step, _tile_dot, _total

# Re-exported: the tests and benchmarks reach the kernels, shapes and helpers through this module.
_REEXPORTED = (
    INTERPRET, _add, _ieee_add, _ieee_mul, _round, _to_out, interpreter_dot, _group_sum, _mm_tile,
    _tile_coords, DEEP_FROM_RUNS, GROUP_FROM_RUNS, LARGE_MAX_RUNS, LARGE_WAVES, ONE_RUN_FILL,
    ONE_RUN_SMALL_ROWS, PERSISTENT_FUSED, PERSISTENT_FUSED_NARROW, PERSISTENT_FUSED_ONE_RUN,
    PERSISTENT_FUSED_ONE_RUN_SMALL_M, SMALL_FUSED, SMALL_M, SMALL_M_WIDE, SMALL_ROWS, LaunchShape,
    persistent_shape_for_fused, small_shape, _push, _run, _runs_tree, _step, _tile_dot, _total,
)  # fmt: skip


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.cache
def _major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def _programs(device: torch.device) -> int:
    return _num_sms(device.index or 0) if device.type == "cuda" else 4


_COUNTERS: dict[tuple, torch.Tensor] = {}
_RETIRED_COUNTERS: list[torch.Tensor] = []
# Tile counters first allocated: one per 16 x 64 output tile of a 4M-column decode call (an LM
# head of 151,936 columns needs 2,374), so the buffer is not replaced in practice.
COUNTERS = 1 << 16


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """``n`` zeroed int32 tile counters for ``_mm_runs``, kept per (device, stream): each launch
    leaves them at zero, and launches on one stream run one after another, so they never share
    a counter while running. A buffer outgrown by a larger call is kept alive, never freed: a
    CUDA graph captured earlier (SGLang's decode) still holds its address."""
    key = stream_key(device)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        if buf is not None:
            _RETIRED_COUNTERS.append(buf)
        buf = torch.zeros(max(n, COUNTERS), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    return buf


def _launch(
    x_MK: torch.Tensor,
    w_NK: torch.Tensor,
    k_block: int,
    run: int,
    acc: torch.dtype,
    persistent: LaunchShape | None = None,
    small: LaunchShape | None = None,
    fused: bool = False,
    out: torch.dtype | None = None,
) -> torch.Tensor:
    """``runs`` = K tiles / ``run``; ``fused`` (``fixed_runs``): a run's tiles accumulate in one
    float32 dot instead of being rounded and added one by one. ``out``: the output's dtype
    (default ``acc``), to which the finished sum is rounded once inside the kernel, as
    ``.to(out)`` rounds it (nearest even): no float32 ``[M, N]`` round trip through memory."""
    out = out or acc
    M, K = x_MK.shape
    N = w_NK.shape[0]
    runs = max(1, math.ceil(K / k_block)) // run
    small = small or small_shape(M, runs, fused)
    split = persistent or PERSISTENT  # the per-run launch takes what this tile cannot fill
    grid_m, grid_n = triton.cdiv(M, split.block_m), triton.cdiv(N, split.block_n)
    progs = _programs(x_MK.device)
    y_MN = torch.empty((M, N), dtype=out, device=x_MK.device)
    if M == 0 or N == 0:  # nothing to launch (an empty batch)
        return y_MN
    if runs > 1 and (grid_m * grid_n < progs or M <= SMALL_ROWS):
        gm, gn = triton.cdiv(M, small.block_m), triton.cdiv(N, small.block_n)
        group = min(small.runs_per_program, runs)
        if runs % group:  # ``supports`` admits powers of two only; a direct call may not
            raise ValueError(f"{runs} runs cannot be cut into groups of {group}: use powers of two")
        parts = runs // group
        # one part: the program writes y itself, and the workspace is never read
        ws_RMN = (
            y_MN.unsqueeze(0) if parts == 1
            else torch.empty((parts, M, N), dtype=acc, device=x_MK.device)
        )  # fmt: skip
        _mm_runs[(gn, parts, gm)](
            x_MK, w_NK, ws_RMN, y_MN, _counters(x_MK.device, gm * gn), M, N, K, x_MK.stride(0),
            w_NK.stride(0), ws_RMN.stride(0), ws_RMN.stride(1), y_MN.stride(0), run, runs,
            _TL[acc], small.block_m, small.block_n, k_block, K % k_block == 0, group, fused,
            _TL[out], num_warps=small.num_warps,
            num_stages=small.num_stages,
        )  # fmt: skip
        return y_MN
    persistent = persistent or persistent_shape(x_MK, w_NK, runs, fused)
    grid_m, grid_n = triton.cdiv(M, persistent.block_m), triton.cdiv(N, persistent.block_n)
    progs = min(progs * persistent.programs_per_sm, grid_m * grid_n)
    iters = triton.next_power_of_2(triton.cdiv(grid_m * grid_n, progs))
    tma = persistent.tma and tma_fits(x_MK, w_NK)
    x_desc = _descriptor(x_MK, persistent.block_m, k_block) if tma else None
    w_desc = _descriptor(w_NK, persistent.block_n, k_block) if tma else None
    _mm_persistent[(progs,)](
        None if tma else x_MK, None if tma else w_NK, x_desc, w_desc, y_MN, M, N, K,
        x_MK.stride(0), w_NK.stride(0), y_MN.stride(0), run, runs, _TL[acc], progs, iters,
        persistent.block_m, persistent.block_n, k_block, GROUP_M, K % k_block == 0, tma, fused,
        _TL[out], num_warps=persistent.num_warps, num_stages=persistent.num_stages,
    )  # fmt: skip
    return y_MN


def persistent_shape(
    x_MK: torch.Tensor, w_NK: torch.Tensor, runs: int, fused: bool = False
) -> LaunchShape:
    """The shipped persistent launch shape for this call (``PERSISTENT`` and its neighbours say
    why); the shape changes no bit, only the time (``fused``: ``persistent_shape_for_fused``)."""
    if not tma_fits(x_MK, w_NK):
        return PERSISTENT_POINTER
    M, N = x_MK.shape[0], w_NK.shape[0]
    if fused:
        return persistent_shape_for_fused(M, N, _programs(x_MK.device), runs)
    waves = LARGE_WAVES * _programs(x_MK.device)

    def fills(shape: LaunchShape) -> bool:  # enough tiles for LARGE_WAVES waves of programs
        return triton.cdiv(M, shape.block_m) * triton.cdiv(N, shape.block_n) >= waves

    # the interpreter (CI) cannot hold a 128 x 128 x 128 float64 product: it runs the 64 x 64 tile
    if not INTERPRET and runs <= LARGE_MAX_RUNS and fills(PERSISTENT_LARGE):
        return PERSISTENT_LARGE
    if runs >= DEEP_FROM_RUNS and fills(PERSISTENT_DEEP):
        return PERSISTENT_DEEP
    return PERSISTENT


def tma_fits(x_MK: torch.Tensor, w_NK: torch.Tensor) -> bool:
    """Both operands can be TMA descriptors (``descriptor_fits``)."""
    return descriptor_fits(x_MK) and descriptor_fits(w_NK)


def descriptor_fits(t: torch.Tensor) -> bool:
    """A TMA descriptor over ``t`` viewed as rows: a Hopper-or-later GPU (or the interpreter),
    contiguous elements within a row, 16-byte aligned row stride and base address."""
    if t.device.type == "cuda" and _major(t.device.index or 0) < 9:
        return False
    return (
        t.stride(-1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0
    )


def _descriptor(t: torch.Tensor, rows: int, cols: int) -> TensorDescriptor:
    return TensorDescriptor(t, shape=list(t.shape), strides=list(t.stride()),
                            block_shape=[rows, cols])  # fmt: skip


def _tiles_per_run(k: int, kp: KernelPolicy, order: str) -> tuple[int, bool]:
    """(K tiles per run, fused) for ``order``: ``fixed_runs`` has ``k_runs(kp)`` fused runs
    (``fixed_run_width``); the other orders round every tile (``_run_length``)."""
    if order == "fixed_runs":
        return fixed_run_width(k, kp) // kp.matmul_k_block, True
    return _run_length(order, max(1, math.ceil(k / kp.matmul_k_block))), False


def supports(x_MK: torch.Tensor, w_NK: torch.Tensor, kp: KernelPolicy, order: str) -> bool:
    """Tensor-core tiles need 16-bit operands of one dtype; the counter needs a power-of-two run
    count (always so for ``sglang_first_level`` and ``fixed_runs``; ``binary`` over a
    non-power-of-two tile count runs the reference)."""
    acc = dtype_of(kp.matmul_accumulation_dtype)
    if x_MK.dtype not in (torch.bfloat16, torch.float16) or w_NK.dtype != x_MK.dtype:
        return False
    if acc not in _TL or kp.matmul_k_block % 16:
        return False
    T = max(1, math.ceil(x_MK.shape[-1] / kp.matmul_k_block))
    runs = T // _tiles_per_run(x_MK.shape[-1], kp, order)[0]
    return runs & (runs - 1) == 0 and runs <= 64


class _Matmul(torch.autograd.Function):
    """Forward: the Triton kernel. Backward: the exact gradient formulas, ``dX = dY W`` and
    ``dW = dY^T X`` (float32 GEMMs; gradients need not be bitwise)."""

    @staticmethod
    def forward(ctx, x_MK, w_NK, k_block, run, acc, fused, out):
        ctx.save_for_backward(x_MK, w_NK)
        return _launch(x_MK, w_NK, k_block, run, acc, fused=fused, out=out)

    @staticmethod
    def backward(ctx, g_MN):
        x_MK, w_NK = ctx.saved_tensors
        g = g_MN.float()
        dx = (g @ w_NK.float()).to(x_MK.dtype) if ctx.needs_input_grad[0] else None
        dw = (g.T @ x_MK.float()).to(w_NK.dtype) if ctx.needs_input_grad[1] else None
        return dx, dw, None, None, None, None, None


def triton_matmul(
    x_MK: torch.Tensor,
    w_NK: torch.Tensor,
    kp: KernelPolicy,
    *,
    out_dtype: torch.dtype | None = None,
    tile_order: str | None = None,
) -> torch.Tensor:
    """The Triton backend of ``invariant_matmul`` (same signature). Operands it cannot put on
    tensor cores (float32/float64 gradient checks) run the reference."""
    order = tile_order or kp.matmul_tile_order
    if not supports(x_MK, w_NK, kp, order):
        return reference_matmul(x_MK, w_NK, kp, out_dtype=out_dtype, tile_order=tile_order)
    lead = x_MK.shape[:-1]
    x2 = x_MK.reshape(-1, x_MK.shape[-1]).contiguous()
    w2 = w_NK.contiguous()
    acc = dtype_of(kp.matmul_accumulation_dtype)
    run, fused = _tiles_per_run(x2.shape[1], kp, order)
    # fixed_runs rounds its float32 sum once, in the kernel's epilogue, to the caller's dtype
    out = (out_dtype or x_MK.dtype) if fused and (out_dtype or x_MK.dtype) in _TL else acc
    if torch.is_grad_enabled() and (x2.requires_grad or w2.requires_grad):
        y_MN = _Matmul.apply(x2, w2, kp.matmul_k_block, run, acc, fused, out)
    else:  # rollout and logprob passes: no autograd node (host time counts at decode sizes)
        y_MN = _launch(x2, w2, kp.matmul_k_block, run, acc, fused=fused, out=out)
    return y_MN.to(out_dtype or x_MK.dtype).reshape(*lead, w_NK.shape[0])
