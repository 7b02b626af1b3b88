"""``kernels.audit``: contract-kernel call counts and the stock-op detector (``parity --strict``).

Runs on CPU; on a CUDA device the same tests run there too (``DEVICES``), through the device's
backend (Triton), since the detector is a torch function mode and must see CUDA calls alike.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from contractgen.adapters.kernels import audit, logsoftmax, matmul, norm, registry, stock
from contractgen.adapters.kernels.attention import chunked_attention

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)] if CUDA else ["cpu"]


def _x_w(device: str, m: int = 5, k: int = 256, n: int = 64, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g).to(device=device, dtype=dtype)
    w = torch.randn(n, k, generator=g).to(device=device, dtype=dtype)
    return x, w


def test_registry_hands_out_the_backend_itself_unless_recording(monkeypatch):
    """Off, ``kernel`` returns the backend function (nothing wrapped); while recording, a
    counting wrapper of it; after the recording, the backend again."""
    monkeypatch.delenv(registry.ENV, raising=False)
    assert registry.kernel("invariant_matmul", "cpu") is matmul.reference_matmul
    with audit.recording():
        counted = registry.kernel("invariant_matmul", "cpu")
        assert counted is not matmul.reference_matmul
        assert counted.__wrapped__ is matmul.reference_matmul
    assert registry.kernel("invariant_matmul", "cpu") is matmul.reference_matmul
    assert not audit.recording_on()


@pytest.mark.parametrize("device", DEVICES)
def test_counts_every_contract_op_call_nested_ones_too(kp, device):
    """Each entry point's calls are counted, a contract op called inside another included (the
    LM head's matmul inside ``lm_head_token_logprobs``); the results are the unrecorded bits."""
    x, w = _x_w(device)
    ids = torch.arange(x.shape[0], device=device)
    plain = logsoftmax.lm_head_token_logprobs(x, w, ids, kp, w.shape[0])
    with audit.recording() as calls:
        got = logsoftmax.lm_head_token_logprobs(x, w, ids, kp, w.shape[0])
        norm.rms_norm(x, torch.ones(x.shape[1], dtype=x.dtype, device=device), 1e-6, kp)
        matmul.invariant_matmul(x, w, kp)
    assert torch.equal(got, plain)
    assert calls.calls == {
        "invariant_matmul": 2, "rms_norm": 1, "token_logprobs": 1, "logsoftmax_chunk_sums": 1
    }  # fmt: skip
    assert calls.stock is None  # counting only: no detector


@pytest.mark.parametrize("device", DEVICES)
def test_strict_sees_stock_ops_outside_contract_kernels_only(kp, device):
    """The contract kernels' own torch ops (``torch.bmm`` in the matmul reference, the Triton
    launch on CUDA) are not flagged; the stock ops the contract replaces, called outside every
    contract kernel, are, each under the contract op that replaces it."""
    x, w = _x_w(device)
    q = torch.randn(1, 2, 8, 16, device=device)
    q_LHD = q[0].transpose(0, 1).contiguous()
    logits = x.float() @ w.float().T
    ids = torch.zeros(5, dtype=torch.long, device=device)
    with audit.recording(strict=True) as inside:
        matmul.invariant_matmul(x, w, kp)
        chunked_attention(q_LHD, q_LHD, q_LHD, torch.arange(8, device=device), kp)
        logsoftmax.token_logprobs(logits, ids, kp, 64)
        norm.rms_norm(x, torch.ones(x.shape[1], dtype=x.dtype, device=device), 1e-6, kp)
    assert inside.stock == []
    assert inside.calls == {
        "chunked_attention": 1, "invariant_matmul": 1, "rms_norm": 1, "token_logprobs": 1,
        "logsoftmax_chunk_sums": 1,
    }  # fmt: skip
    with audit.recording(strict=True) as outside:
        F.linear(x, w)
        torch.matmul(x, w.T)
        F.scaled_dot_product_attention(q, q, q)
        torch.log_softmax(x.float(), -1)
        x.float().log_softmax(-1)
        F.rms_norm(x, (x.shape[1],))
        F.layer_norm(x, (x.shape[1],))
        torch.ones(2, 2, dtype=torch.long) @ torch.ones(2, 2, dtype=torch.long)  # not floating
    seen = {(e["op"], e["stock"]): e["calls"] for e in outside.stock}
    assert seen == {
        ("invariant_matmul", "torch.nn.functional.linear"): 1,
        ("invariant_matmul", "torch.matmul"): 1,
        ("chunked_attention", "torch.nn.functional.scaled_dot_product_attention"): 1,
        ("token_logprobs", "torch.log_softmax"): 1,
        ("token_logprobs", "torch.Tensor.log_softmax"): 1,
        ("rms_norm", "torch.nn.functional.rms_norm"): 1,
        ("rms_norm", "torch.nn.functional.layer_norm"): 1,
    }
    assert outside.calls == {}


@pytest.mark.parametrize("device", DEVICES)
def test_every_stock_twin_is_flagged_under_the_op_it_stands_in_for(kp, device):
    """The stock twins the fault tests swap in (``kernels.stock``) are what --strict must catch."""
    x, w = _x_w(device)
    q = torch.randn(8, 2, 16, device=device)
    ids = torch.zeros(5, dtype=torch.long, device=device)
    twins = {
        "invariant_matmul": [
            lambda: stock.plain_matmul(x, w, kp),
            lambda: stock.fp32_linear(x, w, kp),
        ],
        "chunked_attention": [lambda: stock.sdpa_attention(q, q, q, torch.arange(8), kp)],
        "token_logprobs": [lambda: stock.stock_token_logprobs(x.float(), ids, kp, 64)],
    }
    for op, calls in twins.items():
        for call in calls:
            with audit.recording(strict=True) as seen:
                call()
            assert {e["op"] for e in seen.stock} == {op}, (op, seen.stock)


def test_recording_is_restored_after_an_error_and_nests(kp):
    """An exception inside a contract op leaves no depth behind (the detector would go blind), and
    an inner recording does not leak into the outer one."""
    x, w = _x_w("cpu")

    def broken(*_a, **_k):
        raise RuntimeError("boom")

    with audit.recording(strict=True) as outer:
        with pytest.raises(RuntimeError, match="boom"):
            audit.counted("invariant_matmul", broken)()
        with audit.recording() as inner:
            matmul.invariant_matmul(x, w, kp)
        F.linear(x, w)  # depth is back at 0: flagged
        matmul.invariant_matmul(x, w, kp)
    assert inner.calls == {"invariant_matmul": 1} and inner.stock is None
    assert outer.calls == {"invariant_matmul": 2}
    assert [(e["op"], e["calls"]) for e in outer.stock] == [("invariant_matmul", 1)]
    assert not audit.recording_on()


def test_nested_strict_recordings_count_a_stock_call_once():
    x, w = _x_w("cpu")
    with audit.recording(strict=True) as outer:
        with audit.recording(strict=True) as inner:
            F.linear(x, w)
        F.linear(x, w)
    assert [e["calls"] for e in inner.stock] == [1]
    assert [e["calls"] for e in outer.stock] == [1]


def test_maybe_recording_modes():
    with audit.maybe_recording(None) as none:
        assert none is None and not audit.recording_on()
    with audit.maybe_recording("count") as c:
        assert c is not None and audit.recording_on()
    with pytest.raises(ValueError, match="kernel audit mode 'loud'"):
        with audit.maybe_recording("loud"):
            pass


def test_merge_sums_ranks_and_names_the_rank_of_each_stock_op():
    r0 = audit.KernelCalls({"invariant_matmul": 3, "rms_norm": 1}, [])
    r1 = audit.KernelCalls(
        {"invariant_matmul": 3},
        [{"rank": 0, "op": "rms_norm", "stock": "torch.nn.functional.rms_norm", "calls": 2}],
    )
    merged = audit.merge({1: r1, 0: r0, 2: None})
    assert merged.calls == {"invariant_matmul": 6, "rms_norm": 1} and merged.ranks == 2
    assert merged.stock == [
        {"rank": 1, "op": "rms_norm", "stock": "torch.nn.functional.rms_norm", "calls": 2}
    ]
    assert audit.merge({0: None}) is None
