"""The vLLM model follows the kernel policy it is given: with ``matmul_k_block`` flipped (128 ->
64) its logprobs move off the contract's reference bits and onto the reference engine's bits for
the flipped policy. A vLLM model that ignored the field (or ran stock linears) fails one side."""

from __future__ import annotations

import pytest
import torch
from vllm_case import CONTRACT, reference_case, reference_rollout, require_vllm, run_once

pytestmark = pytest.mark.slow

FLIP = {"matmul_k_block": 64}


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    require_vllm()
    import dataclasses

    from contractgen.adapters.common.rollout import requests_for
    from contractgen.adapters.vllm import client
    from contractgen.parity.workload import make_workload

    ckpt, arch, kp, make_engine = reference_case(tmp_path_factory, CONTRACT)
    flipped = dataclasses.replace(kp, **FLIP)
    assert flipped != kp
    requests = requests_for(make_workload(2, 24, 4), arch.vocab_size)
    ref = reference_rollout(make_engine(), requests)
    ref_flipped = reference_rollout(make_engine(flipped), requests)
    job = client.make_job(ckpt, arch, flipped, [("flipped", requests)], engine={"max_num_batched_tokens": 16})  # fmt: skip
    _, out = run_once(job, tmp_path_factory)
    return requests, ref, ref_flipped, out


def _lps(out, ref, rid):
    key = f"flipped/{rid}"
    return (
        torch.cat([out[key + "/decode_lp"], out[key + "/prefill_lp"]]),
        torch.cat([ref[rid][1], ref[rid][2]]),
    )


def test_flipped_field_moves_the_bits(case):
    requests, ref, _, out = case
    differs = [r.rid for r in requests if not torch.equal(*_lps(out, ref, r.rid))]
    assert differs, f"{FLIP} inside the vLLM model left every logprob on the contract's bits"


def test_flipped_field_is_what_the_reference_computes(case):
    requests, _, ref_flipped, out = case
    for r in requests:
        got, want = _lps(out, ref_flipped, r.rid)
        assert torch.equal(got, want), f"{r.rid}: vLLM under {FLIP} differs from the reference"
