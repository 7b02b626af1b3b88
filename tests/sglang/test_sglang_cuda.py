"""The same invariances on a CUDA device (skipped without one). Parity is per device: these compare
CUDA results with CUDA results, never with CPU bits."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from contractgen.adapters.kernels import (
    chunked_attention,
    invariant_matmul,
    token_logprobs,
    tree_sum,
)
from contractgen.adapters.kernels.stock import plain_matmul
from contractgen.adapters.sglang.engine import Request, RolloutEngine
from contractgen.adapters.sglang.model import ModelArch, ReferenceModel, random_weights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DEV = "cuda"


def _r(*shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype).to(DEV)


@pytest.mark.parametrize("m,k,n", [(7, 256, 96), (300, 1024, 640), (33, 4864, 128)])
def test_cuda_matmul_batch_and_n_invariant(kp_dtype, m, k, n):
    kp, dt = kp_dtype
    x, w = _r(m, k, dtype=dt), _r(n, k, dtype=dt, seed=1)
    full = invariant_matmul(x, w, kp)
    for i in (0, m // 2, m - 1):
        assert torch.equal(invariant_matmul(x[i : i + 1], w, kp)[0], full[i])
    assert torch.equal(invariant_matmul(x, w[:64], kp), full[:, :64])


def test_cuda_public_failure_case_k4864(kp):
    x, w = _r(4, 4864, dtype=torch.bfloat16, seed=7), _r(128, 4864, dtype=torch.bfloat16, seed=8)
    parts = [
        invariant_matmul(x[:, r * 2432 : (r + 1) * 2432], w[:, r * 2432 : (r + 1) * 2432], kp)
        for r in (0, 1)
    ]
    tp1 = invariant_matmul(x, w, kp)
    assert torch.equal(tree_sum(parts), tp1)
    assert not torch.equal(invariant_matmul(x, w, kp, tile_order="binary"), tp1)


def test_cuda_twin_plain_matmul_not_batch_invariant():
    x, w = _r(256, 4096, dtype=torch.bfloat16), _r(4096, 4096, dtype=torch.bfloat16, seed=1)
    assert not torch.equal(plain_matmul(x[:1], w, None)[0], plain_matmul(x, w, None)[0])


def test_cuda_attention_prefill_decode(kp_dtype):
    kp, dt = kp_dtype
    q, k, v = (
        _r(150, 4, 32, dtype=dt),
        _r(150, 2, 32, dtype=dt, seed=1),
        _r(150, 2, 32, dtype=dt, seed=2),
    )
    full = chunked_attention(q, k, v, torch.arange(150, device=DEV), kp)
    for p in (0, 64, 149):
        dec = chunked_attention(
            q[p : p + 1], k[: p + 1], v[: p + 1], torch.tensor([p], device=DEV), kp
        )
        assert torch.equal(dec[0], full[p])


def test_cuda_logprobs_row_invariant(kp):
    logits, ids = _r(9, 1000, dtype=torch.float32) * 3, torch.arange(9, device=DEV) * 100
    lp = token_logprobs(logits, ids, kp, 1000)
    assert torch.equal(token_logprobs(logits[4:5], ids[4:5], kp, 1000)[0], lp[4])


def test_cuda_rollout_batch_invariant_and_rescore(profile, kp_dtype, runtime_policy):
    kp, _ = kp_dtype
    arch = ModelArch.from_profile(profile)
    eng = RolloutEngine(
        ReferenceModel(arch, random_weights(arch), kp, runtime_policy(1), device=DEV),
        progress=False,
    )
    reqs = [
        Request("a", tuple(range(1, 6)), 6),
        Request("b", tuple(range(20, 100)), 4, temperature=1.0, seed=3, arrival_step=1),
        Request("c", (7,), 5, arrival_step=2),
    ]
    mixed = eng.generate(reqs)
    for r in reqs:
        alone = eng.generate([dataclasses.replace(r, arrival_step=0)])[r.rid]
        c = mixed[r.rid]
        assert alone.tokens == c.tokens
        assert torch.equal(alone.logprob_tensor(), c.logprob_tensor())
        assert torch.equal(eng.rescore(c.sequence)[len(c.prompt) - 1 :], c.logprob_tensor())
