"""On CUDA, both sides agree with transformers' float32 forward (the check every GPU run before
2026-12-03 skipped with --no-reference). Needs a CUDA device: skipped on CPU-only CI; run by
``benchmarks/gpu_reference_gates.sh`` on the lent H200 (results in BENCHMARKS.md)."""

from __future__ import annotations

import pytest
import torch
from conftest import run_parity

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CONTRACTS = [
    "qwen3_dense_true_on_policy_v1",
    "qwen3_dense_true_on_policy_v2",
    "qwen3_dense_true_on_policy_v3",
    "llama3_dense_true_on_policy_v1",
    "llama3_dense_true_on_policy_v2",
    "qwen3_moe_true_on_policy_v1",
    "qwen3_moe_true_on_policy_v2",
    "qwen3_moe_true_on_policy_v3",
]


@pytest.mark.parametrize("contract", CONTRACTS)
def test_cuda_gate_agrees_with_transformers(contract, tmp_path):
    code, report, out = run_parity(
        "--device", "cuda", "--contract", contract, "--layouts", "tp1", "--rollout-tps", "1",
        tmp_path=tmp_path,
    )  # fmt: skip
    assert report is not None, out
    ref = report["reference"]
    assert ref["per_layout"], out
    worst = max(e["max_abs_diff"] for e in ref["per_layout"])
    assert ref["within_tolerance"], f"{contract}: max |diff| {worst} vs transformers\n{out}"
    assert code == 0, out
