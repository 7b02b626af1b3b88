"""Real vLLM computes the contract: tokens, sampled-token logprobs and the prefill re-score of the
finished sequences are bitwise the reference engine's (TP=1), for requests of different lengths
joining at different steps, alone and batched, with chunked prefill on (16 tokens a step, so the
40-token prompts and every re-score take several steps). One engine for the module."""

from __future__ import annotations

import pytest
import torch
from vllm_case import CONTRACT, reference_case, reference_rollout, require_vllm, run_once

pytestmark = pytest.mark.slow

ENGINE = {"max_num_batched_tokens": 16, "max_num_seqs": 8}
ALONE = ("r1", "r3")


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    require_vllm()
    from contractgen.adapters.common.rollout import requests_for
    from contractgen.adapters.vllm import client
    from contractgen.parity.workload import make_workload

    ckpt, arch, kp, make_engine = reference_case(tmp_path_factory, CONTRACT)
    # greedy, temperature 0.8 + top-k 40, greedy, top-p 0.9; prompts of 10..40 tokens; arrivals
    # at steps 0, 1, 2, 0
    requests = requests_for(make_workload(4, 40, 6), arch.vocab_size)
    ref = reference_rollout(make_engine(), requests)
    runs = [("batched", requests)] + [(f"alone-{r.rid}", [r]) for r in requests if r.rid in ALONE]
    job = client.make_job(ckpt, arch, kp, runs, engine=ENGINE)
    meta, out = run_once(job, tmp_path_factory)
    return {"requests": requests, "ref": ref, "meta": meta, "out": out, "runs": runs}


def _pairs(case):
    for name, reqs in case["runs"]:
        for r in reqs:
            yield name, r.rid, f"{name}/{r.rid}"


def test_tokens_and_sampled_logprobs_are_the_reference_engines(case):
    out, ref = case["out"], case["ref"]
    for name, rid, key in _pairs(case):
        tokens, decode_lp, _ = ref[rid]
        assert out[key + "/tokens"].tolist() == tokens, f"{name} {rid}: tokens differ"
        got = out[key + "/decode_lp"]
        assert got.dtype == decode_lp.dtype and torch.equal(got, decode_lp), (
            f"{name} {rid}: sampled-token logprobs differ from the reference engine's: "
            f"max |diff| {(got.double() - decode_lp.double()).abs().max():.3g}"
        )


def test_prefill_rescore_is_the_reference_engines(case):
    out, ref = case["out"], case["ref"]
    for name, rid, key in _pairs(case):
        got, want = out[key + "/prefill_lp"], ref[rid][2]
        assert got.dtype == want.dtype and torch.equal(got, want), (
            f"{name} {rid}: prompt logprobs (re-score) differ from the reference engine's: "
            f"max |diff| {(got.double() - want.double()).abs().max():.3g}"
        )


def test_alone_equals_batched(case):
    out = case["out"]
    for rid in ALONE:
        for part in ("tokens", "decode_lp", "prefill_lp"):
            assert torch.equal(
                out[f"alone-{rid}/{rid}/{part}"], out[f"batched/{rid}/{part}"]
            ), f"{rid}: {part} alone differs from the same request in a batch"


def test_the_contract_ops_ran_and_prefill_was_chunked(case):
    """No vLLM op on the scored path (``runner.stock_ops``); the contract's attention ran in every
    layer of every step and the contract sampler drew every token; re-scores took more than one
    step each (chunked prefill)."""
    assert case["meta"]["stock_ops"] == [], case["meta"]["stock_ops"]
    calls, layers = case["meta"]["counts"], 4
    assert calls["attention"] == calls["kv_write"] > 0
    assert calls["attention"] % layers == 0
    rescored = sum(len(reqs) for _, reqs in case["runs"])
    assert calls["prompt_logprobs"] > rescored, calls
    assert calls["sample"] >= max(r.max_new_tokens for r in case["requests"])
