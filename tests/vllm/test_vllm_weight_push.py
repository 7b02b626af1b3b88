"""Weights pushed into the running vLLM engine in place (``collective_rpc`` calling the model's
``load_weights``, then ``reset_prefix_cache``; no restart): the next rollout is bitwise the
reference engine's on the new weights, the one before it the old weights'."""

from __future__ import annotations

import pytest
import torch
from vllm_case import CONTRACT, reference_case, reference_rollout, require_vllm, run_once

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    require_vllm()
    from safetensors.torch import save_file

    from contractgen.adapters.common.rollout import requests_for
    from contractgen.adapters.sglang.engine import RolloutEngine
    from contractgen.adapters.sglang.model import ReferenceModel
    from contractgen.adapters.sglang.session import policies
    from contractgen.adapters.vllm import client
    from contractgen.adapters.vllm.floor import random_weights
    from contractgen.parity.workload import make_workload

    ckpt, arch, kp, make_engine = reference_case(tmp_path_factory, CONTRACT)
    new = random_weights(arch, seed=1)
    path = tmp_path_factory.mktemp("update") / "update.safetensors"
    save_file({k: v.contiguous() for k, v in new.items()}, str(path))
    requests = requests_for(make_workload(2, 24, 4), arch.vocab_size)
    before = reference_rollout(make_engine(), requests)
    _, _, rp = policies(CONTRACT, 1, None, {}, {})
    after = reference_rollout(
        RolloutEngine(ReferenceModel(arch, new, kp, rp), progress=False), requests
    )
    job = client.make_job(
        ckpt, arch, kp, [("before", requests), ("after", requests)],
        engine={"max_num_batched_tokens": 16}, updates={1: path},
    )  # fmt: skip
    meta, out = run_once(job, tmp_path_factory)
    return requests, before, after, meta, out, len(new)


@pytest.mark.parametrize("run", ["before", "after"])
def test_rollout_is_the_reference_on_the_weights_it_holds(case, run):
    requests, before, after, _, out, _ = case
    ref = {"before": before, "after": after}[run]
    for r in requests:
        key = f"{run}/{r.rid}"
        assert out[key + "/tokens"].tolist() == ref[r.rid][0], f"{run} {r.rid}: tokens"
        assert torch.equal(out[key + "/decode_lp"], ref[r.rid][1]), f"{run} {r.rid}: decode"
        assert torch.equal(out[key + "/prefill_lp"], ref[r.rid][2]), f"{run} {r.rid}: prefill"


def test_push_loaded_every_tensor_in_place_and_moved_the_bits(case):
    requests, before, after, meta, out, n = case
    (update,) = meta["updates"]
    assert update["tensors"] == n
    assert any(not torch.equal(before[r.rid][1], after[r.rid][1]) for r in requests)
