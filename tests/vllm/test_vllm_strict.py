"""The strict check of the vLLM run (``runner.stock_ops``) sees a stock vLLM op planted on the
scored path: vLLM's own RMSNorm (its C++ op, which a torch function mode does not see) as the
final norm. The honest run's empty list is asserted in test_vllm_rollout.py."""

from __future__ import annotations

import pytest
from vllm_case import CONTRACT, reference_case, require_vllm, run_once

pytestmark = pytest.mark.slow


def test_planted_vllm_rms_norm_is_seen(tmp_path_factory):
    require_vllm()
    from contractgen.adapters.common.rollout import requests_for
    from contractgen.adapters.vllm import client
    from contractgen.parity.workload import make_workload

    ckpt, arch, kp, _ = reference_case(tmp_path_factory, CONTRACT)
    requests = requests_for(make_workload(1, 12, 2), arch.vocab_size)
    job = client.make_job(ckpt, arch, kp, [("planted", requests)])
    job["plant_stock"] = "rms_norm"
    meta, _ = run_once(job, tmp_path_factory)
    assert any("RMSNorm" in op for op in meta["stock_ops"]), meta["stock_ops"]
