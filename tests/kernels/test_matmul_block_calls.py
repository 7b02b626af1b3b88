"""The CPU reference matmul's two ways of issuing its fixed-shape block GEMMs give the same bits:
``_broadcast_calls`` (CPU: each operand expanded over the other's blocks, a grid of at most
``CPU_BLOCKS_PER_CALL`` blocks a call) and ``_gathered_calls`` unpadded (every block pair
gathered, ``CPU_BLOCKS_PER_CALL`` a call: how the CPU path ran before; CUDA pads its calls). Shapes with one row block (decode), several row blocks per
call, and more column blocks than one call holds; float64 included, whose GEMM bits depend on
the B operand's layout (a twin below shows the row-major layout would differ)."""

from __future__ import annotations

import math

import pytest
import torch

from contractgen.adapters.kernels import matmul as mm

SHAPES = [(1, 256, 1536), (4, 1536, 256), (700, 256, 1536), (300, 128, 64 * 300 + 5)]
INT = {torch.float64: torch.int64, torch.float32: torch.int32}


def _operands(M, K, N, dtype, t=0, k_block=128):
    g = torch.Generator().manual_seed(M * 7 + N)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = (torch.randn(N, K, generator=g) / 16).to(dtype)
    gd = mm._gemm_dtype(dtype)
    nM, nN = math.ceil(M / mm.M_TILE), math.ceil(N / mm.N_TILE)
    x_b = mm._k_tile(x, t, k_block, nM * mm.M_TILE, gd).view(nM, mm.M_TILE, k_block)
    w_b = mm._k_tile(w, t, k_block, nN * mm.N_TILE, gd).view(nN, mm.N_TILE, k_block)
    return x_b, w_b.transpose(1, 2)


def _as_blocks(p_m_Mt_n_Nt: torch.Tensor) -> torch.Tensor:
    nM, _, nN, _ = p_m_Mt_n_Nt.shape
    return p_m_Mt_n_Nt.permute(0, 2, 1, 3).reshape(nM * nN, mm.M_TILE, mm.N_TILE)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("M, K, N", SHAPES)
def test_cpu_calls_equal_gathered_calls_bitwise(M, K, N, dtype):
    x_b, w_b = _operands(M, K, N, dtype)
    ours = _as_blocks(mm._broadcast_calls(x_b, w_b))
    gathered = mm._gathered_calls(x_b, w_b, mm.CPU_BLOCKS_PER_CALL, pad=False)
    iv = INT[ours.dtype]
    assert torch.equal(ours.view(iv), gathered.view(iv))


def test_the_b_layout_matters_in_float64():
    """Why ``_broadcast_calls`` transposes B after the copy: the same float64 blocks with B laid
    out row-major give other bits in some element (so the equality above is not vacuous)."""
    x_b, w_b = _operands(700, 256, 1536, torch.float64)
    gathered = mm._gathered_calls(x_b, w_b, mm.CPU_BLOCKS_PER_CALL, pad=False)
    nM, nN = x_b.shape[0], w_b.shape[0]
    a = x_b[:, None].expand(nM, nN, -1, -1).reshape(-1, mm.M_TILE, x_b.shape[-1])
    b = w_b[None].expand(nM, nN, -1, -1).reshape(-1, w_b.shape[-2], mm.N_TILE)  # row-major
    row_major = torch.bmm(a, b)
    assert torch.allclose(row_major, gathered)
    assert not torch.equal(row_major.view(torch.int64), gathered.view(torch.int64))
