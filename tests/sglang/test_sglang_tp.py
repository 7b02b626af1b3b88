"""TP=1 vs TP=2 vs TP=4 across real processes (gloo), bitwise, with stock twins.

Two spawns in all (one per TP size); each rank runs every kernel check and two rollouts, and the
parent compares with TP=1 computed in-process.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import tp_helpers as tp

from contractgen.adapters.kernels import (
    row_parallel_linear,
    stock,
    token_logprobs,
    tree_all_reduce,
    vocab_parallel_token_logprobs,
)
from contractgen.adapters.kernels.matmul import invariant_matmul
from contractgen.adapters.sglang.engine import Request, RolloutEngine
from contractgen.adapters.sglang.model import ModelArch, ReferenceModel, random_weights

pytestmark = pytest.mark.slow

REQUESTS = [
    Request("a", tuple(range(1, 9)), 5),
    Request("b", tuple(range(30, 100)), 3, temperature=1.0, seed=5, arrival_step=1),
    Request("c", (3,), 6, arrival_step=2),
]
RESCORE = [list(range(5, 85))]


def _data(seed, *shape, dtype=torch.bfloat16):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# Row-parallel problems: (name, K, dtype). 4864 = 38 tiles (Qwen3-4B down_proj per rank at TP=2);
# 9728 = 76 tiles (its full K), 19 per rank at TP=4.
LINEARS = [
    ("k4864", 4864, torch.bfloat16),
    ("k9728", 9728, torch.bfloat16),
    ("f32", 1024, torch.float32),
]


def _policy(kp_d, dtype):
    kp = SimpleNamespace(**kp_d)
    if dtype == torch.float32:
        for k in kp_d:
            if k.endswith("_dtype"):
                setattr(kp, k, "float32")
    return kp


def tp_worker(rank, world, kp_d, rollouts):
    """Every kernel check, then each ``(key, arch, rp_dict, requests)`` rollout, on this rank."""
    out = {"rollouts": {}}
    for key, arch, rp_d, requests in rollouts:
        out["rollouts"][key] = tp.rollout_on_rank(arch, 0, kp_d, rp_d, requests, RESCORE)
    for name, K, dt in LINEARS:
        if (K // 128) % world:
            continue
        kp = _policy(kp_d, dt)
        x, w = _data(1, 5, K, dtype=dt), _data(2, 96, K, dtype=dt)
        kk = K // world
        xs, ws = x[:, rank * kk : (rank + 1) * kk], w[:, rank * kk : (rank + 1) * kk]
        out[name] = row_parallel_linear(xs, ws, kp)
        out[name + "_binary"] = row_parallel_linear(
            xs, ws, SimpleNamespace(**{**vars(kp), "matmul_tile_order": "binary"})
        )
        out[name + "_plain"] = tree_all_reduce(stock.plain_matmul(xs, ws, kp))
    t = _data(10 + rank, 4, 333)
    out["tree"] = tree_all_reduce(t)
    out["ring"] = stock.ring_all_reduce(t)
    out["backend_all_reduce"] = stock.nccl_all_reduce(t)
    kp = _policy(kp_d, torch.bfloat16)
    logits, ids = (
        _data(20, 6, 1024, dtype=torch.float32) * 3,
        torch.tensor([0, 5, 511, 512, 999, 700]),
    )
    shard = 1024 // world
    out["vocab_parallel"] = vocab_parallel_token_logprobs(
        logits[:, rank * shard : (rank + 1) * shard], ids, rank * shard, 1000, kp, None
    )
    out["world"] = dist.get_world_size()
    return out


def _tp4_arch(profile):
    """Whole 128-wide K tiles per rank at TP=4: o_proj K=512, down_proj K=512."""
    base = ModelArch.from_profile(profile)
    return dataclasses.replace(
        base,
        name="tp4-tiny",
        hidden_size=128,
        intermediate_size=512,
        num_layers=2,
        num_attention_heads=8,
        num_kv_heads=4,
        head_dim=64,
        vocab_size=500,
    )


def _tp1(arch, kp, rp, seed=0):
    eng = RolloutEngine(ReferenceModel(arch, random_weights(arch, seed), kp, rp), progress=False)
    out = eng.generate(REQUESTS)
    return {
        "completions": {rid: (c.tokens, c.logprob_tensor()) for rid, c in out.items()},
        "rescores": [eng.rescore(s) for s in RESCORE],
    }


def _assert_same(a, b, what):
    for rid, (tokens, lp) in a["completions"].items():
        assert b["completions"][rid][0] == tokens, (what, rid)
        assert torch.equal(b["completions"][rid][1], lp), (what, rid)
    for x, y in zip(a["rescores"], b["rescores"], strict=True):
        assert torch.equal(x, y), what


def _check_kernels(results, kp, world):
    for r in results:
        assert r["world"] == world
        for key in r:
            if isinstance(r[key], torch.Tensor):  # identical bits on every rank
                assert torch.equal(r[key], results[0][key]), (key, r)
    res = results[0]
    for name, K, dt in LINEARS:
        if name not in res:
            continue
        pol = (
            kp
            if dt == torch.bfloat16
            else dataclasses.replace(
                kp,
                **{f.name: "float32" for f in dataclasses.fields(kp) if f.name.endswith("_dtype")},
            )
        )
        x, w = _data(1, 5, K, dtype=dt), _data(2, 96, K, dtype=dt)
        assert torch.equal(res[name], invariant_matmul(x, w, pol)), (name, world)
        # twins: the stock per-rank GEMM; and for 38 tiles, the plain binary tree
        assert not torch.equal(res[name + "_plain"], stock.plain_matmul(x, w, pol)), name
        if name == "k4864":
            binary_tp1 = invariant_matmul(x, w, pol, tile_order="binary")
            assert not torch.equal(res[name + "_binary"], binary_tp1)
    ts = [_data(10 + r, 4, 333) for r in range(world)]
    logits, ids = (
        _data(20, 6, 1024, dtype=torch.float32) * 3,
        torch.tensor([0, 5, 511, 512, 999, 700]),
    )
    assert torch.equal(res["vocab_parallel"], token_logprobs(logits, ids, kp, 1000))
    return ts


def test_tp2_equals_tp1(profile, kp, runtime_policy):
    ref_arch, arch4 = ModelArch.from_profile(profile), _tp4_arch(profile)
    rp2 = runtime_policy(2)
    stock_rp = dataclasses.replace(rp2, tp_invariant_row_linear=False)
    rollouts = [
        ("ref", ref_arch, tp.plain(rp2), REQUESTS),
        ("tp4-arch", arch4, tp.plain(rp2), REQUESTS),
        ("twin", ref_arch, tp.plain(stock_rp), ()),
    ]
    results = tp.spawn(2, tp_worker, tp.plain(kp), rollouts)
    ts = _check_kernels(results, kp, 2)
    assert torch.equal(results[0]["tree"], ts[0] + ts[1])
    got = results[0]["rollouts"]
    tp1_ref = _tp1(ref_arch, kp, runtime_policy(1))
    _assert_same(tp1_ref, got["ref"], "reference model")
    _assert_same(_tp1(arch4, kp, runtime_policy(1)), got["tp4-arch"], "tp4 model")
    # twin: the stock row linear (plain GEMM per rank) under TP=2 changes the logprobs
    assert not torch.equal(got["twin"]["rescores"][0], tp1_ref["rescores"][0])


def test_tp4_equals_tp1(profile, kp, runtime_policy):
    arch4 = _tp4_arch(profile)
    rp4 = runtime_policy(4)
    # twin: reduce-scatter + all-gather (float32 accumulate) instead of the tree for the MLP
    stock_rp = dataclasses.replace(rp4, disable_reduce_scatter=False)
    rollouts = [("tp4", arch4, tp.plain(rp4), REQUESTS), ("twin", arch4, tp.plain(stock_rp), ())]
    results = tp.spawn(4, tp_worker, tp.plain(kp), rollouts)
    ts = _check_kernels(results, kp, 4)
    assert torch.equal(results[0]["tree"], (ts[0] + ts[1]) + (ts[2] + ts[3]))
    # twin: an NCCL-ring-like order is not the fixed tree
    assert not torch.equal(results[0]["ring"], results[0]["tree"])
    assert not torch.equal(results[0]["backend_all_reduce"], results[0]["tree"])
    tp1 = _tp1(arch4, kp, runtime_policy(1))
    _assert_same(tp1, results[0]["rollouts"]["tp4"], "tp4")
    assert not torch.equal(results[0]["rollouts"]["twin"]["rescores"][0], tp1["rescores"][0])


def test_tp_rollout_helper_tp2(profile, kp, runtime_policy):
    """The public helper (one spawn): rank 0's result, every rank checked equal."""
    arch = ModelArch.from_profile(profile)
    got = tp.tp_rollout(
        2, arch, kp, runtime_policy(2), REQUESTS[:1], rescore=RESCORE, layer_outputs=True
    )
    assert torch.equal(got["rescores"][0], _tp1(arch, kp, runtime_policy(1))["rescores"][0])
    assert len(got["layer_outputs"][0]) == arch.num_layers
