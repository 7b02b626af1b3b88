"""``contractgen parity --rollouts sglang,vllm``: real vLLM's rollout of the gate's workload is
bitwise the reference engine's, and every (rollout target, trainer, layout) pair is exact and
names its rollout target. Refusals are one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from vllm_case import CONTRACT, require_vllm


def _parity(tmp_path, *args: str, timeout: int = 1500):
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "contractgen", "parity", "--contract", CONTRACT, "--quiet", "--json", str(report), *args],  # fmt: skip
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    data = json.loads(report.read_text()) if report.exists() else None
    return proc.returncode, data, proc.stdout + proc.stderr


@pytest.mark.slow
def test_gate_with_vllm_rollout_is_exact(tmp_path):
    require_vllm()
    code, report, out = _parity(
        tmp_path, "--rollouts", "sglang,vllm", "--trainers", "megatron", "--layouts", "tp1,tp2",
        "--rollout-tps", "1", "--no-reference", "--requests", "3", "--prompt-tokens", "96",
        "--new-tokens", "5",
    )  # fmt: skip
    assert code == 0, out
    (entry,) = report["rollout_targets"]
    assert entry["target"] == "vllm" and entry["tokens_identical"] and entry["exact"], entry
    assert entry["contract_op_calls"]["attention"] > 0
    by_target = {}
    for p in report["pairs"]:
        by_target.setdefault(p["rollout_target"], []).append(p)
    assert set(by_target) == {"sglang", "vllm"}
    assert len(by_target["vllm"]) == len(by_target["sglang"]) == 2
    for p in report["pairs"]:
        assert p["exact"] and p["tokens_compared"] == 15, p


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--rollouts", "vllm,tgi"), "unknown rollout target 'tgi'"),
        (("--rollouts", "vllm", "--inject-faults"), "--inject-faults is not built for the vLLM"),
        (("--rollouts", "vllm", "--train-steps", "1"), "--train-steps with --rollouts vllm"),
    ],
)
def test_rollouts_refusals_are_one_line(tmp_path, args, says):
    code, _, out = _parity(tmp_path, "--layouts", "tp1", *args, timeout=300)
    assert code == 2 and says in out, out
