"""Bugs both sides share (one kernel library) pass bitwise parity; the gate must still fail.

``--plant-bug`` switches a bug on inside the shared kernels for the rollout and the trainer alike.
A sign flip inside ``silu_glu`` changes no layout's parity (same bits everywhere): only the
transformers reference can see it. A skipped TP all-reduce keeps rollout TP=2 and trainer TP=2
bitwise equal: only the comparison with the TP=1 reference (and transformers) can see it.
"""

from __future__ import annotations

import pytest
from conftest import run_parity

from contractgen.adapters.kernels import planted


def test_planted_switch_is_scoped():
    assert not planted.active("silu_glu_sign_flip")
    with planted.planted(["silu_glu_sign_flip"]):
        assert planted.active("silu_glu_sign_flip")
    assert not planted.active("silu_glu_sign_flip")
    with pytest.raises(ValueError, match="unknown planted bug"):
        with planted.planted(["nope"]):
            pass


@pytest.mark.slow
def test_shared_silu_sign_flip_fails_the_gate(tmp_path):
    code, report, out = run_parity(
        "--plant-bug", "silu_glu_sign_flip", "--layouts", "tp1", "--rollout-tps", "1",
        tmp_path=tmp_path,
    )  # fmt: skip
    assert code == 1, out
    assert all(p["exact"] for p in report["pairs"]), "parity alone cannot see a shared bug"
    ref = report["reference"]
    assert not ref["within_tolerance"] and ref["max_abs_diff"] > 1e-2, ref
    assert "disagrees with transformers" in out


@pytest.mark.slow
def test_shared_tp_reduce_skipped_fails_the_gate(tmp_path):
    code, report, out = run_parity(
        "--plant-bug", "tp_reduce_skipped", "--layouts", "tp2", "--rollout-tps", "1,2",
        "--no-reference", tmp_path=tmp_path,
    )  # fmt: skip
    assert code == 1, out
    pairs = {p["name"]: p for p in report["pairs"]}
    assert pairs["rollout tp1 \u00d7 trainer tp2pp1cp1"]["exact"] is False
    tp2 = next(r for r in report["rollouts"] if r["tp"] == 2)
    assert not (tp2["tokens_identical"] and tp2["logprobs_exact"]), tp2
