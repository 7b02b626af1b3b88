"""Property tests over random shapes (hypothesis): the invariances hold for any shape, not just
the hand-picked ones."""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from contractgen.adapters.kernels import (
    chunked_attention,
    invariant_matmul,
    rms_norm,
    token_logprobs,
)
from contractgen.adapters.kernels.reduce import fixed_sum

SETTINGS = settings(max_examples=20, deadline=None)
DTYPES = st.sampled_from(["bfloat16", "float32"])


def _policy(kp, dtype):
    return dataclasses.replace(
        kp, **{f.name: dtype for f in dataclasses.fields(kp) if f.name.endswith("_dtype")}
    )


def _rand(seed, *shape, dtype):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@SETTINGS
@given(
    m=st.integers(1, 150),
    k=st.integers(1, 700),
    n=st.integers(1, 200),
    row=st.integers(0, 149),
    dtype=DTYPES,
    seed=st.integers(0, 2**16),
)
def test_matmul_row_and_column_invariance(kp, m, k, n, row, dtype, seed):
    pol, dt = _policy(kp, dtype), getattr(torch, dtype)
    x, w = _rand(seed, m, k, dtype=dt), _rand(seed + 1, n, k, dtype=dt)
    row = row % m
    full = invariant_matmul(x, w, pol)
    assert torch.equal(invariant_matmul(x[row : row + 1], w, pol)[0], full[row])
    assert torch.equal(invariant_matmul(x, w[64:], pol), full[:, 64:])


@SETTINGS
@given(
    s=st.integers(1, 200),
    kvh=st.integers(1, 3),
    rep=st.integers(1, 3),
    d=st.sampled_from([8, 16, 64]),
    dtype=DTYPES,
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_attention_decode_equals_full(kp, s, kvh, rep, d, dtype, seed, data):
    pol, dt = _policy(kp, dtype), getattr(torch, dtype)
    q, k, v = (_rand(seed + i, s, h, d, dtype=dt) for i, h in enumerate((kvh * rep, kvh, kvh)))
    p = data.draw(st.integers(0, s - 1))
    full = chunked_attention(q, k, v, torch.arange(s), pol)
    dec = chunked_attention(q[p : p + 1], k[: p + 1], v[: p + 1], torch.tensor([p]), pol)
    assert torch.equal(dec[0], full[p])


@SETTINGS
@given(
    t=st.integers(1, 40),
    hidden=st.integers(1, 600),
    vocab=st.integers(2, 900),
    dtype=DTYPES,
    seed=st.integers(0, 2**16),
)
def test_norm_and_logprobs_row_invariance(kp, t, hidden, vocab, dtype, seed):
    pol, dt = _policy(kp, dtype), getattr(torch, dtype)
    x, w = _rand(seed, t, hidden, dtype=dt), _rand(seed + 1, hidden, dtype=dt)
    full = rms_norm(x, w, 1e-6, pol)
    assert torch.equal(rms_norm(x[-1:], w, 1e-6, pol)[0], full[-1])
    logits = _rand(seed + 2, t, vocab, dtype=torch.float32) * 4
    ids = torch.randint(0, vocab, (t,), generator=torch.Generator().manual_seed(seed))
    lp = token_logprobs(logits, ids, pol, vocab)
    assert torch.equal(token_logprobs(logits[-1:], ids[-1:], pol, vocab)[0], lp[-1])


@SETTINGS
@given(n=st.integers(1, 300), rows=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_fixed_sum_is_exact_tree_and_shape_free(n, rows, seed):
    x = _rand(seed, rows, n, dtype=torch.float32)
    full = fixed_sum(x)
    assert torch.equal(fixed_sum(x[-1:])[0], full[-1])
    torch.testing.assert_close(full.double(), x.double().sum(-1), rtol=1e-5, atol=1e-4)
