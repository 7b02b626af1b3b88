"""``matmul_column_k_runs`` (v4): a matmul whose K no TP layout splits is one float32 dot over all
of K; a row-parallel linear keeps ``matmul_k_runs``' runs and tree. Which one a call gets is
decided by the policy it is handed: the contract's own policy (column), or ``shard_policy``'s
(row, at every TP including 1). Each claim is bitwise on both backends, next to the twin that
shows the other classification gives other bits.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from types import SimpleNamespace

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined
pytest.importorskip("triton")

from contractgen.adapters.kernels import tree_sum  # noqa: E402
from contractgen.adapters.kernels.matmul import (  # noqa: E402
    invariant_matmul,
    k_runs,
    reference_matmul,
    shard_policy,
)
from contractgen.adapters.kernels.policy import kernel_policy  # noqa: E402
from contractgen.adapters.kernels.triton import matmul as tmm  # noqa: E402
from contractgen.codegen.vendored import load_target  # noqa: E402

pytestmark = [pytest.mark.gpu] if CUDA else []
DEV = "cuda" if CUDA else "cpu"
BF = torch.bfloat16
BACKENDS = {"reference": reference_matmul, "triton": tmm.triton_matmul}


@pytest.fixture(scope="module")
def kps():
    schema = load_target("sglang").schema
    return {
        v: kernel_policy(schema.kernel_policy_for(f"qwen3_dense_true_on_policy_{v}"))
        for v in ("v3", "v4")
    }


def _r(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(BF).to(DEV)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == BF else t.view(torch.int32)


def test_v4_is_v3_with_one_column_run(kps):
    v3, v4 = kps["v3"], kps["v4"]
    assert (v4.matmul_k_runs, v4.matmul_column_k_runs, v3.matmul_column_k_runs) == (8, 1, None)
    assert dataclasses.replace(v4, matmul_column_k_runs=None) == v3
    assert (k_runs(v3), k_runs(v4)) == (8, 1)


def test_shard_policy_is_the_row_policy_at_every_tp(kps):
    """A row-parallel rank's policy drops the column count: at TP=1 too (8 runs), where v3's
    ``shard_policy`` hands back the contract's own policy unchanged."""
    v3, v4 = kps["v3"], kps["v4"]
    assert shard_policy(v3, 1) is v3
    for tp in (1, 2, 4, 8):
        local = shard_policy(v4, tp)
        assert (local.matmul_k_runs, local.matmul_column_k_runs, k_runs(local)) == (
            8 // tp,
            None,
            8 // tp,
        )
    assert shard_policy(v4, 1) is shard_policy(v4, 1)  # cached per policy object


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_a_column_call_is_one_float32_dot(kps, backend):
    """The contract's policy: one run over all 24 tiles, the same bits as v3's kernel with
    ``matmul_k_runs: 1``; the twin: v3's 8 runs of 3 give other bits."""
    mm = BACKENDS[backend]
    x, w = _r(5, 1536), _r(72, 1536, seed=1)
    got = mm(x, w, kps["v4"], out_dtype=torch.float32)
    one_run = dataclasses.replace(kps["v3"], matmul_k_runs=1)
    assert torch.equal(_bits(got), _bits(mm(x, w, one_run, out_dtype=torch.float32)))
    assert not torch.equal(_bits(got), _bits(mm(x, w, kps["v3"], out_dtype=torch.float32)))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_one_column_run_is_batch_and_decode_invariant(kps, backend):
    mm = BACKENDS[backend]
    x, w = _r(9, 1024), _r(70, 1024, seed=1)
    full = mm(x, w, kps["v4"])
    for i in (0, 4, 8):
        assert torch.equal(_bits(mm(x[i : i + 1], w, kps["v4"])[0]), _bits(full[i]))
    other = torch.cat([_r(5, 1024, seed=7), x[1:2]])
    assert torch.equal(_bits(mm(other, w, kps["v4"])[-1]), _bits(full[1]))


def test_every_one_run_launch_tile_gives_the_same_bits(kps):
    """The one-run launch shapes the Triton backend ships (16 x 32 at a decode-sized M, 64 x 64,
    and on a GPU 128 x 256) give the contract's bits: a tile changes the time, not the sum (the
    interpreter cannot hold the 128 x 256 float64 product). The twin: two runs of 8 tiles, on the
    same launch, are another float32 sum."""
    x, w = _r(20, 1024), _r(72, 1024, seed=1)
    want = _bits(tmm.triton_matmul(x, w, kps["v4"]))
    k_block = kps["v4"].matmul_k_block
    shapes = [tmm.PERSISTENT_FUSED_ONE_RUN_SMALL_M, tmm.PERSISTENT_FUSED_NARROW]
    shapes += [tmm.PERSISTENT_FUSED_ONE_RUN] if CUDA else []
    for shape in shapes:
        for rows in (slice(0, 1), slice(0, 16), slice(0, 20)):
            y = tmm._launch(x[rows], w, k_block, 1024 // k_block, torch.float32,
                            persistent=shape, fused=True, out=BF)  # fmt: skip
            assert torch.equal(_bits(y), want[rows]), (shape, rows)
    # float32 out: the twin's last-bit differences would mostly round away in bfloat16
    one, two = (
        tmm._launch(x, w, k_block, 1024 // k_block // runs, torch.float32,
                    persistent=tmm.PERSISTENT_FUSED_ONE_RUN_SMALL_M, fused=True)
        for runs in (1, 2)
    )  # fmt: skip
    assert torch.equal(_bits(one.to(BF)), want)
    assert not torch.equal(_bits(two), _bits(one))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_row_parallel_split_equals_the_row_policy_at_tp1(kps, backend, tp):
    """Row-parallel under v4: ranks holding 8 / tp runs each, finished by the float32 tree, give
    the bits of ``shard_policy(v4, 1)`` (8 runs), which are v3's; the twin: the contract's own
    (column) policy on the whole K is another sum, so a row call that skipped ``shard_policy``
    would break TP invariance."""
    mm = BACKENDS[backend]
    x, w = _r(6, 4096), _r(64, 4096, seed=1)
    kk = x.shape[1] // tp
    local = shard_policy(kps["v4"], tp)
    split = tree_sum(
        [mm(x[:, i * kk : (i + 1) * kk], w[:, i * kk : (i + 1) * kk], local,
            out_dtype=torch.float32) for i in range(tp)]
    )  # fmt: skip
    row1 = mm(x, w, shard_policy(kps["v4"], 1), out_dtype=torch.float32)
    assert torch.equal(_bits(split), _bits(row1))
    assert torch.equal(_bits(row1), _bits(mm(x, w, kps["v3"], out_dtype=torch.float32)))
    assert not torch.equal(_bits(split), _bits(mm(x, w, kps["v4"], out_dtype=torch.float32)))


def test_the_rollout_gives_row_parallel_linears_the_row_runs_at_tp1(kps):
    """The rollout's ops at TP=1: ``row_partial`` runs ``shard_policy``'s 8 runs (the trainer's
    row linears do the same), ``column_linear`` one run. Before v4 the TP=1 row op took the
    contract's policy as is, which under v4 is the column count (the gate caught it: rollout tp1
    against every other layout)."""
    from contractgen.adapters.sglang.ops import resolve_ops

    rp = load_target("sglang").runtime_policy.policy_for(
        "qwen3_dense_true_on_policy_v4", SimpleNamespace(tp_size=1)
    )
    ops = resolve_ops(kps["v4"], rp, 1)
    x, w = _r(3, 1536), _r(64, 1536, seed=2)
    row = ops.row_partial(x, w, kps["v4"])  # the device's backend (registry), as the layers run
    f32 = torch.float32
    assert torch.equal(_bits(row), _bits(invariant_matmul(x, w, kps["v3"], out_dtype=f32)))
    assert not torch.equal(_bits(row), _bits(invariant_matmul(x, w, kps["v4"], out_dtype=f32)))


# v3's bits under this change: sha256 (first 16 hex digits) of the bf16 outputs, recorded from
# the code before matmul_column_k_runs existed (commit cad5f33), on both backends.
V3_PINNED = {
    ("reference", (5, 1024, 96)): "c6bd08675c1e434b",
    ("reference", (3, 2560, 64)): "a53d2e9d7d39c963",
    ("triton", (5, 1024, 96)): "424b9f076c69edad",
    ("triton", (3, 2560, 64)): "a53d2e9d7d39c963",
}


@pytest.mark.skipif(CUDA, reason="pins are the CPU reference's and the interpreter's bits")
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_v3_bits_do_not_move(kps, backend):
    for (pinned_backend, (m, k, n)), want in V3_PINNED.items():
        if pinned_backend != backend:
            continue
        g = torch.Generator().manual_seed(m * k + n)
        x = torch.randn(m, k, generator=g).bfloat16()
        w = torch.randn(n, k, generator=g).bfloat16()
        for kp in (kps["v3"], shard_policy(kps["v3"], 1)):
            y = BACKENDS[backend](x, w, kp)
            got = hashlib.sha256(y.view(torch.int16).numpy().tobytes()).hexdigest()[:16]
            assert got == want, (backend, (m, k, n))
