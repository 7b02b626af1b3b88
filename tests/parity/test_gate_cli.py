"""`contractgen parity` end to end: the default gate (what CI runs), the report, bad input."""

from __future__ import annotations

import pytest
from conftest import V1, V2, run_parity

REPORT_KEYS = {"contract", "fingerprint", "device", "dtype", "layouts", "faults", "reference"}
LAYOUT_KEYS = {
    "name",
    "tp",
    "pp",
    "cp",
    "exact",
    "tokens_compared",
    "max_abs_diff",
    "first_divergence",
}


@pytest.mark.slow
def test_default_gate_is_exact_at_every_default_layout(tmp_path):
    code, report, out = run_parity(tmp_path=tmp_path)
    assert code == 0, out
    assert REPORT_KEYS <= set(report)
    assert report["contract"] == V1 and report["device"] == "cpu" and report["dtype"] == "contract"
    assert report["fingerprint"].startswith("sha256:")
    names = [lay["name"] for lay in report["layouts"]]
    assert names[:4] == ["tp1", "tp2", "pp2", "cp2"]
    for lay in report["layouts"]:
        assert LAYOUT_KEYS <= set(lay)
        assert lay["exact"] is True and lay["max_abs_diff"] == 0 and lay["first_divergence"] is None
        assert lay["tokens_compared"] == 40
    assert report["faults"]["injected"] == 0
    assert report["reference"] is None and "no --checkpoint" in report["reference_note"]
    assert "PASS" in out


@pytest.mark.slow
def test_v2_gate_compares_decode_logprobs_in_float32(tmp_path):
    code, report, out = run_parity("--contract", V2, "--layouts", "tp1,tp2", tmp_path=tmp_path)
    assert code == 0, out
    assert report["logprob_contract"] == "decode"
    assert all(lay["exact"] for lay in report["layouts"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--contract", "nope_v1"], "unknown true-on-policy contract 'nope_v1'"),
        (["--layouts", "tp2x"], "expected tpN, ppN, cpN"),
        (["--layouts", "tp8"], "TP=8 not allowed"),
        (["--layouts", "pp3"], "PP=3 not allowed"),
        (["--layouts", "tp1,tp1"], "repeated layout"),
    ],
)
def test_bad_input_exits_2_with_the_reason(tmp_path, args, message):
    code, report, out = run_parity(*args, tmp_path=tmp_path, timeout=120)
    assert code == 2, out
    assert message in out
    assert report is None  # nothing written
