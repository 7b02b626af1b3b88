"""Bugs the gate used to pass (issue 31): each is planted, the default checks must exit 1, and the
honest run of the same command exits 0.

A plant is a ``sitecustomize`` module on ``PYTHONPATH``: every process of the run (the command,
the fork server and each rank it starts) imports it at startup and patches the code under test,
as a bug in that code would. Only the run's subprocess sees it; this process never does.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
from conftest import V1, run_parity, run_parity_in_process

from contractgen.parity.gate import failures
from contractgen.parity.harness import bits, compare

# The cheapest run with every default check: one trainer layout, the TP=1 rollout, transformers.
TP1 = ("--layouts", "tp1", "--rollout-tps", "1")

# The contract -> architecture mapping both sides use (``ModelArch.from_profile``), made wrong.
MAPPING_BUG = """
import dataclasses
from contractgen.adapters.sglang import model as _model

_stock = _model.ModelArch.from_profile.__func__

def _planted(cls, profile, dims=None):
    return dataclasses.replace(_stock(cls, profile, dims), {field}={value!r})

_model.ModelArch.from_profile = classmethod(_planted)
"""

# The trainer's attention only: packs reaching position 128 are attended in 128-key chunks.
TRAINER_CHUNK_BUG = """
from contractgen.adapters.megatron import attention as _attention

_stock = _attention.chunked_attention_lse

def _planted(q, k, v, positions, kp, **kw):
    if int(positions.max()) >= 128:
        kw["kv_chunk"] = 128
    return _stock(q, k, v, positions, kp, **kw)

_attention.chunked_attention_lse = _planted
"""

# The scored logprobs as the gate's comparison sees them, first token of the first sequence set
# to {rollout!r} on the rollout side and {trainer!r} on the trainer's (``keep``: tokens kept).
SCORED_BUG = """
from contractgen.parity import gate_run as _gate_run, pairs as _pairs

def _edit(lps, value):
    out = [t.clone()[:{keep}] for t in lps]
    if out[0].numel():
        out[0][0] = value
    return out

# patched where the gate's pairs call them (``pairs.trainer_for`` is a module global there)
_scored, _trainer_for = _gate_run.GateRun.scored_rollout, _pairs.trainer_for
_gate_run.GateRun.scored_rollout = lambda self, r: _edit(_scored(self, r), {rollout!r})
_pairs.trainer_for = lambda run, lay, r: _edit(_trainer_for(run, lay, r), {trainer!r})
"""


def _planted_run(monkeypatch, tmp_path, source: str, *args: str):
    """``run_parity(*args)`` with ``source`` imported first in every process of the run."""
    site = tmp_path / "plant"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(source))
    monkeypatch.setenv("PYTHONPATH", str(site))
    out = tmp_path / "run"
    out.mkdir()
    return run_parity(*args, tmp_path=out, fresh=True)


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    """The unplanted run the plants are measured against (with transformers)."""
    code, report, out = run_parity(*TP1, tmp_path=tmp_path_factory.mktemp("honest"))
    assert code == 0, out
    return report


# ---------------------------------------------------------------------------------------------
# The comparison: bit patterns, and nothing compared is not exact (unit level).
# ---------------------------------------------------------------------------------------------


def test_compare_sees_signed_zero_and_nan_payloads():
    a = torch.tensor([-1.5, 0.0, -2.0])
    b = torch.tensor([-1.5, -0.0, -2.0])
    assert torch.equal(a, b), "values: +0.0 == -0.0"
    cmp = compare([a], [b])
    assert not cmp.exact and cmp.first == (0, 1) and cmp.max_abs_diff == 0.0
    quiet = torch.tensor([float("nan")])
    payload = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    assert not compare([quiet], [payload]).exact
    assert compare([quiet], [quiet.clone()]).exact, "the same NaN bits are the same bits"
    assert compare([a.bfloat16()], [a.bfloat16()]).exact
    assert not compare([a], [a.double()]).exact, "dtype is part of the bits"
    assert bits(torch.tensor([0.0])).item() == 0 and bits(torch.tensor([-0.0])).item() == -(2**31)


def test_compare_of_nothing_is_not_exact():
    empty = compare([torch.zeros(0)], [torch.zeros(0)])
    assert empty.tokens_compared == 0 and not empty.exact and empty.first is None
    assert compare([], []).exact is False
    pair = {"name": "rollout tp1 x trainer tp1pp1cp1", "exact": False, "tokens_compared": 0}
    report = {
        "layouts": [],
        "pairs": [pair],
        "rollout_tokens_identical": True,
        "rollouts": [],
        "reference": None,
        "faults": {"undetected": []},
    }
    assert failures(report) == [
        "rollout tp1 x trainer tp1pp1cp1 compared no tokens (an empty comparison proves nothing)"
    ]


# ---------------------------------------------------------------------------------------------
# The oracle shares no code with the contract -> architecture mapping (unit level).
# ---------------------------------------------------------------------------------------------


def test_reference_config_does_not_go_through_the_adapters_mapping(monkeypatch):
    import dataclasses

    from contractgen.adapters.sglang import model
    from contractgen.codegen.vendored import load_target
    from contractgen.parity.reference import reference_config

    profile = load_target("sglang").schema.model_profile_for(V1)
    stock = model.ModelArch.from_profile.__func__
    monkeypatch.setattr(
        model.ModelArch,
        "from_profile",
        classmethod(lambda cls, p, d=None: dataclasses.replace(stock(cls, p, d), rope_theta=1e4)),
    )
    assert model.ModelArch.from_profile(profile).rope_theta == 1e4
    config = reference_config(profile)
    assert config.rope_parameters["rope_theta"] == profile.reference_model.rope_theta == 1e6
    assert config.rms_norm_eps == profile.norm_eps == 1e-6
    assert config.num_hidden_layers == profile.reference_model.num_layers


def test_eps_plant_moves_transformers_past_the_cpu_tolerance():
    """The measurement the tolerance is set from: eps 1e-5 instead of 1e-6 moves transformers'
    own float32 logprobs by more than the tolerance of every device (2.96e-5 measured)."""
    import dataclasses

    from contractgen.adapters.sglang.model import ModelArch, random_weights
    from contractgen.codegen.vendored import load_target
    from contractgen.parity.reference import (
        hf_logprobs,
        hf_model,
        logprob_tolerance,
        max_abs_diff,
        reference_sequences,
    )

    profile = load_target("sglang").schema.model_profile_for(V1)
    weights = random_weights(ModelArch.from_profile(profile), seed=0)
    seqs = reference_sequences(1000, 512)
    honest = hf_logprobs(hf_model(weights, profile, torch.float32), seqs)
    wide = dataclasses.replace(profile, norm_eps=1e-5)
    planted = hf_logprobs(hf_model(weights, wide, torch.float32), seqs)
    moved = max_abs_diff(honest, planted)
    assert moved > 1.5 * max(logprob_tolerance("cpu"), logprob_tolerance("cuda")), moved


def test_qwen3_next_tolerance_is_its_own_and_still_sees_the_eps_plant():
    """Qwen3-Next's float32 forward is farther from the exact math than the dense families'
    (transformers' own float32 vs float64: 1.13e-5 here), so its transformers check uses
    ``FAMILY_LOGPROB_TOLERANCE`` (3e-5); the other families keep 1.5e-5. The eps plant still
    moves transformers' logprobs far past it (2.7 measured), and transformers' own float32 drift
    stays inside it (the measurement it is set from)."""
    import dataclasses

    from contractgen.adapters.sglang.model import ModelArch, random_weights
    from contractgen.codegen.vendored import load_target
    from contractgen.parity.reference import (
        hf_logprobs,
        hf_model,
        logprob_tolerance,
        max_abs_diff,
        reference_sequences,
    )

    next_id = "qwen3_next_true_on_policy_v1"
    tol = logprob_tolerance("cuda", family="qwen3_next")
    assert tol == logprob_tolerance("cpu", family="qwen3_next") == 3e-5
    assert logprob_tolerance("cuda", family="qwen3_dense") == logprob_tolerance("cuda") == 1.5e-5
    profile = load_target("sglang").schema.model_profile_for(next_id)
    weights = random_weights(ModelArch.from_profile(profile), seed=0)
    seqs = reference_sequences(1000, 1024)
    honest = hf_logprobs(hf_model(weights, profile, torch.float32), seqs)
    exact = hf_logprobs(hf_model(weights, profile, torch.float64), seqs)
    assert 1.5e-5 * 0.5 < max_abs_diff(honest, exact) < tol  # why the family needs its own
    wide = dataclasses.replace(profile, norm_eps=1e-5)
    planted = hf_logprobs(hf_model(weights, wide, torch.float32), seqs)
    assert max_abs_diff(honest, planted) > 100 * tol


# ---------------------------------------------------------------------------------------------
# Planted bugs, gate level.
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_wrong_rope_theta_in_the_mapping_fails_the_gate(honest, monkeypatch, tmp_path):
    """Both sides read RoPE theta 1e4 instead of the contract's 1e6: bitwise parity holds, and
    transformers (its config built from the contract's values, not the mapping) disagrees."""
    plant = MAPPING_BUG.format(field="rope_theta", value=1e4)
    code, report, out = _planted_run(monkeypatch, tmp_path, plant, *TP1)
    assert code == 1, out
    assert all(p["exact"] for p in report["pairs"]), "a shared bug keeps the pairs exact"
    assert not report["reference"]["within_tolerance"]
    assert report["reference"]["max_abs_diff"] > 1e-2, report["reference"]
    assert honest["reference"]["within_tolerance"]


@pytest.mark.slow
def test_rmsnorm_eps_1e5_on_both_sides_fails_the_gate(honest, monkeypatch, tmp_path):
    """eps 1e-5 instead of 1e-6 on both sides: 3.05e-5 from transformers, outside the CPU
    tolerance, where the honest run agrees to a few 1e-6."""
    plant = MAPPING_BUG.format(field="norm_eps", value=1e-5)
    code, report, out = _planted_run(monkeypatch, tmp_path, plant, *TP1)
    assert code == 1, out
    assert all(p["exact"] for p in report["pairs"])
    ref, tol = report["reference"], report["reference"]["tolerance"]
    assert not ref["within_tolerance"] and tol < ref["max_abs_diff"] < 1e-3, ref
    assert honest["reference"]["max_abs_diff"] <= tol / 2, honest["reference"]


@pytest.mark.slow
def test_trainer_wide_chunks_past_position_128_fail_the_gate(honest, monkeypatch, tmp_path):
    """The trainer alone attends packs reaching position 128 in 128-key chunks: the default
    workload's two longest requests are scored from queries past position 128, so the pair
    differs; the old workload (70-token prompts) never reaches 128 and passes the same bug."""
    code, report, out = _planted_run(monkeypatch, tmp_path, TRAINER_CHUNK_BUG, *TP1)
    assert code == 1, out
    wl = report["workload"]
    assert max(p + n for p, n in zip(wl["prompt_tokens"], wl["new_tokens"], strict=True)) == 186
    (pair,) = report["pairs"]
    assert not pair["exact"] and pair["tokens_compared"] == 40, pair
    assert report["reference"]["within_tolerance"], "float32 agreement alone cannot see it"
    assert honest["pairs"][0]["exact"]
    short = tmp_path / "short"
    short.mkdir()
    code, report, out = _planted_run(
        monkeypatch, short, TRAINER_CHUNK_BUG, *TP1, "--prompt-tokens", "70", "--no-reference"
    )
    assert code == 0 and report["pairs"][0]["exact"], out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rollout", "trainer", "keep", "why"),
    [
        (0.0, -0.0, None, "not exact"),
        (0.0, 0.0, 0, "compared no tokens"),
    ],
)
def test_gate_compares_bits_and_needs_tokens(
    honest, monkeypatch, tmp_path, rollout, trainer, keep, why
):
    """+0.0 against -0.0 (equal values, other bits), and a pair of empty comparisons: the gate
    exits 1 on each (``torch.equal`` passed the first, and both passed before); unplanted, the
    same layout's pair is exact over 40 tokens."""
    assert honest["pairs"][0]["exact"] and honest["pairs"][0]["tokens_compared"] == 40
    plant = SCORED_BUG.format(rollout=rollout, trainer=trainer, keep=keep)
    code, report, out = _planted_run(monkeypatch, tmp_path, plant, *TP1, "--no-reference")
    assert code == 1, out
    (pair,) = report["pairs"]
    assert not pair["exact"] and pair["max_abs_diff"] == 0.0, pair
    assert pair["tokens_compared"] == (0 if keep == 0 else 40)
    assert why in out


# ---------------------------------------------------------------------------------------------
# CUDA layouts that need more devices than there are: one line, exit 2, nothing started.
# ---------------------------------------------------------------------------------------------


def test_cuda_layout_beyond_the_visible_devices_exits_2(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    code, report, out = run_parity_in_process(
        "--device", "cuda", "--layouts", "pp2", tmp_path=tmp_path
    )
    assert code == 2, out
    # run_parity_in_process appends the exception's repr (here the SystemExit(2) of the exit)
    lines = [ln for ln in out.splitlines() if ln.strip() and ln != "SystemExit(2)"]
    assert len(lines) == 1, out
    assert lines[0].startswith("error: layout pp2 needs 2 CUDA devices, 1 visible; "), out
    assert report is None


def test_default_cuda_layouts_stop_at_the_visible_devices():
    from contractgen.commands.parity import _fit_gpus
    from contractgen.parity.layouts import parse_layouts

    layouts = parse_layouts("tp1,tp2,pp2,cp2,tp2pp2")
    assert [lay.name for lay in _fit_gpus(layouts, 1, given=False)] == ["tp1"]
    assert [lay.name for lay in _fit_gpus(layouts, 2, given=False)] == ["tp1", "tp2", "pp2", "cp2"]
    assert _fit_gpus(layouts, 4, given=True) == layouts
