"""Llama 3 (no QK-norm, llama3 RoPE scaling) in real vLLM: tokens, sampled-token and re-score
logprobs bitwise the reference engine's on the contract's reference model, batched, with chunked
prefill on."""

from __future__ import annotations

import pytest
import torch
from vllm_case import reference_case, reference_rollout, require_vllm, run_once

pytestmark = pytest.mark.slow

LLAMA3 = "llama3_dense_true_on_policy_v1"


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    require_vllm()
    from contractgen.adapters.common.rollout import requests_for
    from contractgen.adapters.vllm import client
    from contractgen.parity.workload import make_workload

    ckpt, arch, kp, make_engine = reference_case(tmp_path_factory, LLAMA3)
    assert arch.family == "llama3_dense" and not arch.qk_norm
    requests = requests_for(make_workload(4, 32, 4), arch.vocab_size)
    ref = reference_rollout(make_engine(), requests)
    job = client.make_job(ckpt, arch, kp, [("batched", requests)], engine={"max_num_batched_tokens": 16})  # fmt: skip
    _, out = run_once(job, tmp_path_factory)
    return requests, ref, out


def test_llama3_rollout_is_the_reference_engines(case):
    requests, ref, out = case
    for r in requests:
        key = f"batched/{r.rid}"
        assert out[key + "/tokens"].tolist() == ref[r.rid][0], f"{r.rid}: tokens"
        assert torch.equal(out[key + "/decode_lp"], ref[r.rid][1]), f"{r.rid}: decode logprobs"
        assert torch.equal(out[key + "/prefill_lp"], ref[r.rid][2]), f"{r.rid}: re-score"
