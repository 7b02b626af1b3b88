"""``contractgen parity --rollouts``: what the vLLM target does not run is refused in one line,
exit 2. (Its gate run, bitwise the reference rollout and exact with a trainer at two layouts, is
the rollout half of ``tests/parity/test_target_conformance.py``.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from vllm_case import CONTRACT


def _parity(tmp_path, *args: str, timeout: int = 1500):
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "contractgen", "parity", "--contract", CONTRACT, "--quiet", "--json", str(report), *args],  # fmt: skip
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    data = json.loads(report.read_text()) if report.exists() else None
    return proc.returncode, data, proc.stdout + proc.stderr


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
