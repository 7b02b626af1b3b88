"""`contractgen parity` end to end: the default gate (what CI runs), the report, bad input."""

from __future__ import annotations

import pytest
from conftest import V1, reference_qwen3_config, run_parity, run_parity_in_process

REPORT_KEYS = {
    "contract",
    "fingerprint",
    "device",
    "dtype",
    "layouts",
    "pairs",
    "rollout_tokens_identical",
    "faults",
    "reference",
    "grads",
}
PAIR_KEYS = {"name", "rollout_tp", "trainer", "exact", "max_abs_diff", "tokens_compared"}
FAULT_KEYS = {"injected", "detected", "explained", "undetected", "errors"}
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
    """The default gate: every rollout TP of the model (1, 2, 4) against the TP=1 reference,
    every trainer layout, every pairing, and transformers' float32 forward at every layout."""
    code, report, out = run_parity(tmp_path=tmp_path, fresh=True)  # the entry point itself
    assert code == 0, out
    assert REPORT_KEYS <= set(report)
    assert FAULT_KEYS <= set(report["faults"])
    assert report["rollout_tps"] == [1, 2, 4] and report["rollout_tokens_identical"] is True
    assert len(report["pairs"]) == 3 * len(report["layouts"])
    for pair in report["pairs"]:
        assert PAIR_KEYS <= set(pair) and set(pair["trainer"]) == {"tp", "pp", "cp", "dp", "ep"}
        assert pair["exact"] and pair["max_abs_diff"] == 0 and pair["tokens_compared"] == 40
    assert "rollout tp4 \u00d7 trainer tp1pp2cp1" in {p["name"] for p in report["pairs"]}
    ref = report["reference"]
    assert ref is not None and ref["within_tolerance"], ref
    assert min(ref["sequence_lengths"]) >= 256
    sides = {(e["side"], e["tp"], e["pp"], e["cp"]) for e in ref["per_layout"]}
    assert {("trainer", lay["tp"], lay["pp"], lay["cp"]) for lay in report["layouts"]} <= sides
    assert all(e["max_abs_diff"] <= ref["tolerance"] for e in ref["per_layout"])
    assert report["grads"] is None
    assert report["contract"] == V1 and report["device"] == "cpu" and report["dtype"] == "contract"
    assert report["fingerprint"].startswith("sha256:")
    names = [lay["name"] for lay in report["layouts"]]
    assert names[:4] == ["tp1", "tp2", "pp2", "cp2"]
    for lay in report["layouts"]:
        assert LAYOUT_KEYS <= set(lay)
        assert lay["exact"] is True and lay["max_abs_diff"] == 0 and lay["first_divergence"] is None
        assert lay["tokens_compared"] == 40
    assert report["faults"]["injected"] == 0
    assert "PASS" in out


@pytest.mark.slow
def test_checkpoint_gate_reports_transformers_reference(tmp_path):
    """--checkpoint: a Hugging Face directory (as save_pretrained writes it) runs the gate, and
    the report compares the scored logprobs with transformers' own float32 forward."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(reference_qwen3_config())
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    code, report, out = run_parity(
        "--checkpoint", str(ckpt), "--layouts", "tp1,tp2pp2", "--rollout-tps", "1", "--dtype",
        "float32", "--grads", tmp_path=tmp_path,
    )  # fmt: skip
    assert code == 0, out
    assert report["dtype"] == "float32" and report["diagnostic"] is True
    assert all(lay["exact"] for lay in report["layouts"])
    ref = report["reference"]
    assert ref is not None and ref["name"].startswith("transformers")
    assert ref["max_abs_diff"] < 1e-4, ref
    # --grads: the trainer's gradient of the scored logprobs' sum vs float64 autograd; at
    # tp2pp2 backward through two stages, every TP shard and stage gathered under HF names
    for grads in report["grads"]["per_layout"]:
        assert grads["supported"] and grads["within_tolerance"], grads
        assert grads["max_rel_diff"] <= report["grads"]["tolerance"] == 1e-4
        assert grads["parameters_compared"] == len(model.state_dict()), grads


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--contract", "nope_v1"], "unknown true-on-policy contract 'nope_v1'"),
        (["--layouts", "tp2x"], "expected tpN, ppN, cpN"),
        (["--layouts", "tp8"], "tp8: --tp 8: not in qwen3-tiny-random's tp_sizes [1, 2, 4]"),
        (["--layouts", "pp3"], "pp3: --pp 3: not in the contract's parallel.training.pp [1, 2, 4]"),
        (["--layouts", "tp4cp4"], "tp4cp4: --cp 4: does not divide the 2 num_attention_heads"),
        (["--layouts", "tp1,tp1"], "repeated layout"),
        (["--rollout-tps", "8"], "rollout tp8: --rollout-tp 8: not in qwen3-tiny-random's"),
        (["--plant-bug", "nope"], "--plant-bug 'nope': unknown"),
        (["--prompt-tokens", "500", "--new-tokens", "20"], "exceeds max_position_embeddings=512"),
    ],
)
def test_bad_input_exits_2_with_the_reason(tmp_path, args, message):
    code, report, out = run_parity_in_process(*args, tmp_path=tmp_path)
    assert code == 2, out
    assert message in out
    assert report is None  # nothing written
