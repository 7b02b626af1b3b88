"""The ``fixed_runs`` tile order (v3's fast invariant numerics), on both backends, and the pinned
bits of the orders that came before it.

``fixed_runs``: K cut into ``matmul_k_runs`` equal runs, each run's ``matmul_k_block``-wide tile
dots accumulated in float32 (one tensor-core accumulator on the GPU), the runs summed by a binary
tree in float32 that the TP all-reduce continues, one rounding at the end. Each invariance is
shown bitwise, next to a twin showing what breaks it. Bits are compared within one backend (the
interpreter's dot stands in for the tensor core; see ``test_triton_kernels.py``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined
pytest.importorskip("triton")

from contractgen.adapters.kernels import tree_sum  # noqa: E402
from contractgen.adapters.kernels.linear import row_parallel_linear  # noqa: E402
from contractgen.adapters.kernels.matmul import (  # noqa: E402
    fixed_run_width,
    reference_matmul,
    shard_policy,
)
from contractgen.adapters.kernels.triton import matmul as tmm  # noqa: E402
from contractgen.adapters.kernels.triton import matmul_shapes  # noqa: E402
from contractgen.codegen.vendored import load_target  # noqa: E402

pytestmark = [pytest.mark.gpu] if CUDA else []
DEV = "cuda" if CUDA else "cpu"
BF = torch.bfloat16
V3 = "qwen3_dense_true_on_policy_v3"
BACKENDS = {"reference": reference_matmul, "triton": tmm.triton_matmul}


@pytest.fixture(scope="module")
def schema():
    return load_target("sglang").schema


@pytest.fixture(scope="module")
def kp3(schema):
    return schema.kernel_policy_for(V3)


def _r(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(BF).to(DEV)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == BF else t.view(torch.int32)


def _row_split(mm, x, w, kp, tp, local_kp):
    """Row-parallel over ``tp`` ranks: each rank's K slice in float32, then the fixed tree (the
    float32 sum, before the one rounding)."""
    kk = x.shape[1] // tp
    parts = [
        mm(x[:, i * kk : (i + 1) * kk], w[:, i * kk : (i + 1) * kk], local_kp,
           out_dtype=torch.float32)
        for i in range(tp)
    ]  # fmt: skip
    return tree_sum(parts)


def test_v3_policy_is_fixed_runs_in_float32(kp3):
    assert (kp3.matmul_tile_order, kp3.matmul_k_runs, kp3.matmul_accumulation_dtype) == (
        "fixed_runs",
        8,
        "float32",
    )


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize(
    "m,k,n",
    [(9, 1024, 70), (3, 1536, 130),
     # on an H200 the whole batch takes the persistent launch, one row the per-run launch
     pytest.param(520, 1024, 1100, marks=pytest.mark.skipif(not CUDA, reason="GPU-sized"))],
)  # fmt: skip
def test_fixed_runs_batch_and_decode_invariant(kp3, backend, m, k, n):
    """A row's bits do not depend on the other rows of the call (one row: the decode step)."""
    mm = BACKENDS[backend]
    x, w = _r(m, k), _r(n, k, seed=1)
    full = mm(x, w, kp3)
    for i in (0, m // 2, m - 1):
        assert torch.equal(_bits(mm(x[i : i + 1], w, kp3)[0]), _bits(full[i]))
    other = torch.cat([_r(5, k, seed=7), x[1:2]])
    assert torch.equal(_bits(mm(other, w, kp3)[-1]), _bits(full[1]))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_fixed_runs_tp_split_equals_tp1(kp3, backend, tp):
    """A rank holding ``matmul_k_runs / tp`` runs (``shard_policy``) computes a whole subtree;
    the tree all-reduce in float32 finishes it: TP=1's bits (float32 sum and rounded output).
    The twin: a rank that cuts its shard into all 8 runs again (the full policy) gives another
    float32 sum."""
    mm = BACKENDS[backend]
    x, w = _r(6, 4096), _r(64, 4096, seed=1)
    full = mm(x, w, kp3, out_dtype=torch.float32)
    local = shard_policy(kp3, tp)
    assert local.matmul_k_runs == 8 // tp
    assert torch.equal(_bits(_row_split(mm, x, w, kp3, tp, local)), _bits(full))
    assert torch.equal(_bits(_row_split(mm, x, w, kp3, tp, local).to(BF)), _bits(mm(x, w, kp3)))
    assert not torch.equal(_bits(_row_split(mm, x, w, kp3, tp, kp3)), _bits(full))


def test_row_parallel_linear_takes_the_shard_policy(kp3, monkeypatch):
    """``row_parallel_linear`` asks ``shard_policy`` for the rank's share of the runs."""
    from contractgen.adapters.kernels import linear

    seen = []
    monkeypatch.setattr(linear, "world_size", lambda group=None: 4)
    monkeypatch.setattr(linear, "all_reduce_for", lambda kp: lambda t, group: t)
    monkeypatch.setattr(
        linear, "invariant_matmul", lambda x, w, kp, out_dtype: seen.append(kp) or x @ w.T
    )
    x, w = _r(2, 384).float(), _r(8, 384, seed=1).float()
    row_parallel_linear(x, w, kp3)
    assert seen[0].matmul_k_runs == 2


def test_fixed_runs_launch_and_tile_choices_keep_bits(kp3, monkeypatch):
    """Triton: every launch shape and both launches (persistent, per-run) give the same bits."""
    x, w = _r(70, 1024), _r(200, 1024, seed=1)
    full = tmm.triton_matmul(x, w, kp3)
    run = fixed_run_width(1024, kp3) // kp3.matmul_k_block
    shapes = [
        tmm.LaunchShape(block_m=64, block_n=64, num_warps=4, num_stages=2),
        tmm.LaunchShape(block_m=64, block_n=64, num_warps=4, num_stages=3, programs_per_sm=2,
                        tma=True),
        tmm.PERSISTENT_DEEP,
    ]  # fmt: skip
    for shape in shapes:
        y = tmm._launch(x, w, kp3.matmul_k_block, run, torch.float32, persistent=shape,
                        fused=True)  # fmt: skip
        assert torch.equal(_bits(y.to(BF)), _bits(full)), shape
    small = [tmm.SMALL_FUSED, tmm.LaunchShape(64, 32, 4, 3, runs_per_program=4)]
    with monkeypatch.context() as m:
        m.setattr(tmm, "_programs", lambda device: 10_000)  # the per-run launch
        for shape in small:
            y = tmm._launch(x[:3], w, kp3.matmul_k_block, run, torch.float32, small=shape,
                            fused=True)  # fmt: skip
            assert torch.equal(_bits(y.to(BF)), _bits(full[:3])), shape


def test_fused_runs_take_64_row_tiles_on_every_launch(kp3):
    """The shipped shapes for fused runs are 64-row tiles of one warpgroup on both launches
    (``SMALL_FUSED`` says why), whatever M; v1's per-tile order keeps its 16-row decode tile."""
    for m in (1, 16, 64):
        for runs in (1, 2, 8):
            shape = tmm.small_shape(m, runs, fused=True)
            assert (shape.block_m, shape.num_warps) == (64, 4)
    assert tmm.small_shape(1, 8).block_m == 16


def test_fused_persistent_shape_is_wide_where_its_tiles_fill_the_gpu(kp3, monkeypatch):
    """128 x 128 where there are at least as many tiles as programs, else 64 x 64 (two
    programs per SM); the interpreter always takes the narrow tile (float64 products)."""
    monkeypatch.setattr(matmul_shapes, "INTERPRET", False)
    wide, narrow = tmm.PERSISTENT_FUSED, tmm.PERSISTENT_FUSED_NARROW
    assert (wide.block_m, wide.block_n, narrow.block_m, narrow.block_n) == (128, 128, 64, 64)
    assert tmm.persistent_shape_for_fused(8192, 4096, 132) == wide  # 64 x 32 tiles
    assert tmm.persistent_shape_for_fused(1024, 2048, 128) == wide  # 8 x 16 = 128 tiles
    assert tmm.persistent_shape_for_fused(1024, 2048, 132) == narrow  # fewer than programs
    # one run (no counter level live): 128 x 256 where those tiles fill the GPU
    one = tmm.PERSISTENT_FUSED_ONE_RUN
    assert (one.block_m, one.block_n) == (128, 256)
    assert tmm.persistent_shape_for_fused(8192, 4096, 132, runs=1) == one  # 64 x 16 tiles
    assert tmm.persistent_shape_for_fused(1024, 2048, 128, runs=1) == wide  # 64 wide tiles
    assert tmm.persistent_shape_for_fused(4096, 1024, 132, runs=1) == one  # 128 tiles: 97 %
    assert tmm.persistent_shape_for_fused(4096, 1024, 132, runs=2) == wide  # 256 tiles
    assert tmm.persistent_shape_for_fused(8192, 4096, 132, runs=2) == wide
    # one run, a decode-sized M: 16 x 32 (more programs); at M = 64 and for split runs, 64 x 64
    small = tmm.PERSISTENT_FUSED_ONE_RUN_SMALL_M
    assert (small.block_m, small.block_n) == (16, 32)
    assert tmm.persistent_shape_for_fused(1, 1024, 132, runs=1) == small
    assert tmm.persistent_shape_for_fused(16, 9728, 132, runs=1) == small
    assert tmm.persistent_shape_for_fused(17, 1024, 132, runs=1) == narrow
    assert tmm.persistent_shape_for_fused(64, 4096, 132, runs=1) == narrow
    assert tmm.persistent_shape_for_fused(16, 1024, 132, runs=2) == narrow
    monkeypatch.setattr(matmul_shapes, "INTERPRET", True)
    assert tmm.persistent_shape_for_fused(8192, 4096, 132) == narrow
    assert tmm.persistent_shape_for_fused(8192, 4096, 132, runs=1) == narrow
    assert tmm.persistent_shape_for_fused(1, 1024, 132, runs=1) == narrow


@pytest.mark.parametrize("k", [512, 2560])
def test_fused_sum_is_rounded_once_in_the_kernel_as_torch_rounds_it(kp3, k, monkeypatch):
    """fixed_runs stores its float32 sum in the output dtype (nearest even, in the epilogue):
    the same bits as storing float32 and rounding with ``.to``, on both launches; with bf16
    values placed at rounding ties (the low 16 bits exactly 0x8000) so ties-to-even shows."""
    x, w = _r(130, k), _r(96, k, seed=1)
    run = fixed_run_width(k, kp3) // kp3.matmul_k_block
    for programs in (10_000, 1):  # the per-run launch, then the persistent one
        with monkeypatch.context() as m:
            m.setattr(tmm, "_programs", lambda device, n=programs: n)
            wide = tmm._launch(x, w, kp3.matmul_k_block, run, torch.float32, fused=True)
            narrow = tmm._launch(x, w, kp3.matmul_k_block, run, torch.float32, fused=True,
                                 out=BF)  # fmt: skip
        assert wide.dtype == torch.float32 and narrow.dtype == BF
        assert torch.equal(_bits(narrow), _bits(wide.to(BF))), programs
    # ties: a + half an ulp of a, exact in float32, halfway between two bf16 values
    a = (1 + torch.arange(128, device=DEV) / 128.0).to(BF)  # every 8-bit significand in [1, 2)
    xt = torch.zeros(128, k, dtype=BF, device=DEV)
    xt[:, 0], xt[:, 1] = a, 2.0**-8
    wt = torch.zeros(64, k, dtype=BF, device=DEV)
    wt[:, :2] = 1.0
    exact = (xt.float() @ wt.float().T)[:, 0]
    got = tmm._launch(xt, wt, kp3.matmul_k_block, run, torch.float32, fused=True, out=BF)[:, 0]
    assert torch.equal(_bits(got), _bits(exact.to(BF)))
    up = got.float() > a.float()
    assert up.any() and not up.all()  # odd significands rounded up, even ones down


@pytest.mark.parametrize("k", [512, 2560])  # runs of one tile (8 x 64) and of five
def test_fused_runs_agree_on_every_launch(kp3, k, monkeypatch):
    """Persistent (TMA and pointer loads) and per-run launches (16- and 64-row tiles, one or two
    runs a program), at 4, 64 and 130 rows: the same bits. Runs of one tile are where Triton
    folded the counter's add into the dot (``_ieee_add``)."""
    S = tmm.LaunchShape
    x, w = _r(130, k), _r(128, k, seed=1)
    run = fixed_run_width(k, kp3) // kp3.matmul_k_block

    def launch(x, **kw):
        return tmm._launch(x, w, kp3.matmul_k_block, run, torch.float32, fused=True, **kw)

    small = [S(64, 64, 4, 3, runs_per_program=2), S(16, 64, 4, 3),
             S(16, 64, 4, 3, runs_per_program=2)]  # fmt: skip
    with monkeypatch.context() as m:
        m.setattr(tmm, "_programs", lambda device: 10_000)
        ref = launch(x, small=S(64, 64, 4, 3))
        for M in (4, 64, 130):
            for shape in small:
                assert torch.equal(_bits(launch(x[:M], small=shape)), _bits(ref[:M])), (M, shape)
    with monkeypatch.context() as m:
        m.setattr(tmm, "_programs", lambda device: 1)  # one persistent program, every tile
        for M in (4, 64, 130):
            for shape in (S(64, 64, 4, 3, 2, True), S(64, 64, 4, 3, 2, False)):
                got = launch(x[:M].contiguous(), persistent=shape)
                assert torch.equal(_bits(got), _bits(ref[:M])), (M, shape)


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_twin_fixed_runs_is_not_the_per_tile_order(kp3, schema, backend):
    """Fused float32 runs are other numerics than v1's bf16-rounded tiles, and nearer the exact
    product (one rounding instead of one per tile and per add)."""
    mm = BACKENDS[backend]
    kp1 = schema.kernel_policy_for("qwen3_dense_true_on_policy_v1")
    x, w = _r(16, 1536), _r(96, 1536, seed=1)
    y3, y1 = mm(x, w, kp3), mm(x, w, dataclasses.replace(kp1, matmul_k_block=64))
    assert not torch.equal(_bits(y3), _bits(y1))
    exact = x.double() @ w.double().T
    err3 = float((y3.double() - exact).abs().max())
    err1 = float((y1.double() - exact).abs().max())
    assert err3 < err1


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_fixed_runs_fields_change_the_bits(kp3, backend):
    """What the gate's fault injection flips: half the runs, a narrower tile, bf16 runs, another
    order (seen in the float32 sum a row-parallel rank hands the all-reduce)."""
    mm = BACKENDS[backend]
    x, w = _r(4, 1536), _r(64, 1536, seed=1)  # 24 tiles: 8 runs of 3
    base = _bits(mm(x, w, kp3, out_dtype=torch.float32))
    flips = [{"matmul_k_runs": 4}, {"matmul_accumulation_dtype": "bfloat16"}]
    if not CUDA:  # on an H200 a run's k16 instructions chain the same whatever the tile width
        flips.append({"matmul_k_block": 32})
    for flip in (
        *flips,
        {"matmul_tile_order": "binary"},  # sglang_first_level: 8 runs of 3 here too
    ):
        y = mm(x, w, dataclasses.replace(kp3, **flip), out_dtype=torch.float32)
        assert not torch.equal(_bits(y), base), flip


def test_fixed_runs_refuses_shapes_outside_the_contract(kp3):
    with pytest.raises(ValueError, match="not 8 runs of whole 64-wide tiles"):
        fixed_run_width(1000, kp3)
    with pytest.raises(ValueError, match="does not divide kernel_policy.matmul_k_runs=8"):
        shard_policy(kp3, 16)
    assert shard_policy(kp3, 1) is kp3 and shard_policy(kp3, 2) is shard_policy(kp3, 2)


# Bits of the orders v1/v2 use, recorded from the code before ``fixed_runs`` existed (commit
# bca69b7), on both backends: sha256 (first 16 hex digits) of the bf16 output's bit patterns.
PINNED = {
    (5, 1024, 96): "f2db76b035afb4d2",
    (3, 2560, 64): "3540cfd63c241179",
    (7, 9728, 64): "70f97b13ba16c5ad",
    (1, 256, 130): "2a335564699b81aa",
}


@pytest.mark.skipif(CUDA, reason="pins are the CPU reference's and the interpreter's bits")
@pytest.mark.parametrize(
    "contract",
    ["qwen3_dense_true_on_policy_v1", "qwen3_dense_true_on_policy_v2",
     "llama3_dense_true_on_policy_v1"],
)  # fmt: skip
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_v1_v2_bits_do_not_move(schema, contract, backend):
    kp = schema.kernel_policy_for(contract)
    for (m, k, n), want in PINNED.items():
        if backend == "triton" and k > 2560:
            continue  # the interpreter's float64 products: slow at 76 tiles
        g = torch.Generator().manual_seed(m * k + n)
        x = torch.randn(m, k, generator=g).bfloat16()
        w = torch.randn(n, k, generator=g).bfloat16()
        y = BACKENDS[backend](x, w, kp)
        got = hashlib.sha256(y.view(torch.int16).numpy().tobytes()).hexdigest()[:16]
        assert got == want, (contract, backend, (m, k, n))
