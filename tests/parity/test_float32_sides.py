"""The float32 runs of the two sides against each other (issue 31): with every dtype float32 both
sides still call one kernel library, so every rollout TP and trainer layout must give the TP=1
rollout's bits. Until 2026-12-03 the trainer's float32 attention on CUDA ran other kernels (TF32
dots) and only the distance from transformers showed it; a split that stays inside the
transformers tolerance showed nowhere. Plants use a ``sitecustomize`` on ``PYTHONPATH``, as
``test_gate_sensitivity.py`` does (every process of the run imports it)."""

from __future__ import annotations

import textwrap

import pytest
from conftest import run_parity

from contractgen.parity.correctness import bits_digest, reference_report
from contractgen.parity.gate import failures

# The trainer's attention only, and only in float32: KV chunks of twice the contract's size (the
# same function up to float32 rounding, so well inside the transformers tolerance).
TRAINER_FLOAT32_BUG = """
import torch
from contractgen.adapters.megatron import attention as _attention

_stock = _attention.chunked_attention_lse

def _planted(q, k, v, positions, kp, **kw):
    if q.dtype == torch.float32:
        kw["kv_chunk"] = 2 * kp.attention_kv_chunk
    return _stock(q, k, v, positions, kp, **kw)

_attention.chunked_attention_lse = _planted
"""


def test_digest_is_of_bit_patterns_dtype_and_shape():
    import torch

    a = [torch.tensor([-1.0, 0.0])]
    assert bits_digest(a) == bits_digest([torch.tensor([-1.0, 0.0])])
    assert bits_digest(a) != bits_digest([torch.tensor([-1.0, -0.0])])  # equal values, other bits
    assert bits_digest(a) != bits_digest([a[0].double()])
    assert bits_digest(a) != bits_digest([a[0][:1], a[0][1:]])


def test_report_names_the_runs_whose_float32_bits_split():
    from contractgen.parity.correctness import Reference

    ref = Reference("transformers", [[1, 2]], [], 1e-5)
    entry = {"max_abs_diff": 1e-7, "within_tolerance": True}
    runs = [
        {**entry, "name": "rollout tp1", "bits_sha256": "a"},
        {**entry, "name": "trainer tp1pp1cp1", "bits_sha256": "a"},
        {**entry, "name": "trainer tp2pp1cp1", "bits_sha256": "b"},
    ]
    rep = reference_report(ref, runs)
    assert not rep["float32_bits_identical"] and rep["within_tolerance"]
    assert rep["float32_bits_differ_from_first"] == ["trainer tp2pp1cp1"]
    report = {"layouts": [], "pairs": [], "rollout_tokens_identical": True, "rollouts": [],
              "reference": rep, "faults": {"undetected": []}}  # fmt: skip
    assert any("float32 trainer tp2pp1cp1 differs bitwise" in f for f in failures(report))


@pytest.mark.slow
def test_trainer_only_float32_split_fails_the_gate(monkeypatch, tmp_path):
    """The plant keeps the trainer within the transformers tolerance and the bf16 pairs exact;
    only the float32 comparison of the two sides sees it."""
    site = tmp_path / "plant"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(TRAINER_FLOAT32_BUG))
    monkeypatch.setenv("PYTHONPATH", str(site))
    code, report, out = run_parity(
        "--layouts", "tp1", "--rollout-tps", "1", tmp_path=tmp_path, fresh=True
    )
    assert report is not None, out
    ref = report["reference"]
    assert ref["within_tolerance"], out  # transformers alone would pass it
    assert all(p["exact"] for p in report["pairs"]), out  # so would the bf16 pairs
    assert ref["float32_bits_differ_from_first"] == ["trainer tp1pp1cp1"], out
    assert code == 1, out
    assert "differs bitwise from float32 rollout tp1" in out
