"""Bitwise invariances of the tiled matmul, with stock twins that must break them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from contractgen.adapters.kernels import invariant_matmul, tree_sum
from contractgen.adapters.kernels.stock import plain_matmul
from contractgen.adapters.tile_order import first_level_block

SHAPES = [(7, 256, 96), (33, 384, 130), (20, 1024, 64), (5, 200, 40)]


def _data(m, k, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).to(dtype), torch.randn(n, k, generator=g).to(dtype)


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_row_invariant_to_batch_composition(kp_dtype, m, k, n):
    kp, dt = kp_dtype
    x, w = _data(m, k, n, dt)
    full = invariant_matmul(x, w, kp)
    for i in (0, m // 2, m - 1):
        assert torch.equal(invariant_matmul(x[i : i + 1], w, kp)[0], full[i])
    other = torch.cat([torch.randn(5, k).to(dt), x[m // 2 : m // 2 + 1]])
    assert torch.equal(invariant_matmul(other, w, kp)[-1], full[m // 2])
    assert torch.equal(invariant_matmul(x[: m // 2 + 1], w, kp), full[: m // 2 + 1])


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_columns_invariant_to_n_shards(kp_dtype, m, k, n):
    kp, dt = kp_dtype
    x, w = _data(m, k, n, dt, seed=1)
    full = invariant_matmul(x, w, kp)
    for lo in range(0, n, 64):
        assert torch.equal(invariant_matmul(x, w[lo : lo + 64], kp), full[:, lo : lo + 64])


def test_twin_plain_matmul_is_not_batch_invariant():
    """Stock torch.matmul: a row alone (GEMV) differs from the same row inside a batch."""
    for seed in range(20):
        x, w = _data(64, 512, 256, torch.float32, seed)
        if not torch.equal(plain_matmul(x[:1], w, None)[0], plain_matmul(x, w, None)[0]):
            return
    pytest.fail("plain torch.matmul never changed a row's bits with the batch size")


def test_k_not_multiple_of_block_is_batch_invariant(kp_dtype):
    kp, dt = kp_dtype
    x, w = _data(9, 200, 70, dt, seed=3)
    full = invariant_matmul(x, w, kp)
    assert torch.equal(invariant_matmul(x[4:5], w, kp)[0], full[4])


def test_matches_reference_product_float32(kp32):
    x, w = _data(10, 512, 70, torch.float64)
    ref = x @ w.T
    got = invariant_matmul(x.float(), w.float(), kp32).double()
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-4)


def _tp_split(x, w, kp, tp, order=None):
    """Row-parallel emulated locally: each rank's subtree, then the fixed-tree reduce."""
    kk = x.shape[1] // tp
    acc = getattr(torch, kp.matmul_accumulation_dtype)
    parts = [
        invariant_matmul(
            x[:, r * kk : (r + 1) * kk],
            w[:, r * kk : (r + 1) * kk],
            kp,
            out_dtype=acc,
            tile_order=order,
        )
        for r in range(tp)
    ]
    return tree_sum(parts).to(x.dtype)


@pytest.mark.parametrize("k", [4864, 9728, 1024, 1536])
def test_tp_split_equals_tp1_sglang_order(kp, k):
    x, w = _data(3, k, 64, torch.bfloat16, seed=k)
    full = invariant_matmul(x, w, kp)
    for tp in (2, 4):
        tiles = k // 128
        if tiles % tp == 0 and (tiles // tp) % first_level_block(tiles) == 0:
            assert torch.equal(_tp_split(x, w, kp, tp), full), (k, tp)


def test_public_failure_case_k4864(kp):
    """Qwen3-4B down_proj at TP=2: 38 tiles, 19 per rank. SGLang's order is TP-invariant; a plain
    binary tree over the 38 tiles (the public Megatron bug) gives other bits."""
    assert first_level_block(38) == 19
    x, w = _data(4, 4864, 128, torch.bfloat16, seed=7)
    tp1 = invariant_matmul(x, w, kp)
    assert torch.equal(_tp_split(x, w, kp, 2), tp1)
    binary = invariant_matmul(x, w, kp, tile_order="binary")
    assert not torch.equal(binary, tp1)
    # and binary is not TP-invariant either: 19 tiles per rank is not a subtree of 38.
    kpb = dataclasses.replace(kp, matmul_tile_order="binary")
    assert not torch.equal(_tp_split(x, w, kpb, 2), invariant_matmul(x, w, kpb))


def test_twin_tp_split_with_plain_matmul_differs(kp):
    x, w = _data(4, 4864, 128, torch.bfloat16, seed=8)
    kk = 2432
    parts = [
        plain_matmul(x[:, r * kk : (r + 1) * kk], w[:, r * kk : (r + 1) * kk], kp) for r in (0, 1)
    ]
    assert not torch.equal(tree_sum(parts), plain_matmul(x, w, kp))


def test_first_level_block_values():
    assert [first_level_block(t) for t in (1, 2, 3, 4, 12, 32, 38, 76)] == [
        1,
        2,
        3,
        2,
        3,
        2,
        19,
        19,
    ]


def test_first_level_block_matches_generated_schema(generated):
    gen = generated.schema.first_level_block
    assert all(first_level_block(t) == gen(t) for t in range(1, 300))
