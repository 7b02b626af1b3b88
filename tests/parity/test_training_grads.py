"""``parity --train-steps``'s step-0 gradient check, and the bug only it can see.

The attention backward without the softmax scale in dK changes no logprob, so every pair stays
exact and the ratio stays 1 through the RL loop; only comparing the trainer's gradient with
float64 autograd shows it. The plant (``kernels.planted.BACKWARD_BUGS``) is a monkeypatch of the
kernel library's attention backward, applied in the ranks that run the job; the slow test shows the RL workload
of ``test_training.py`` fails with it and the honest run of that workload (that file's
three-step test) passes.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import run_parity

DK_BUG = "attention_dk_scale_dropped"

# test_training.py's RL_RUN (its three-step test passes on it)
RL_RUN = ("--layouts", "tp1,tp2,pp2,cp2", "--rollout-tps", "1,2", "--new-tokens", "6")


def _attention_case():
    """One packed pair of causal GQA sequences (4 query heads on 2 KV heads) and its saved
    forward: the operands of ``attention_backward``."""
    from contractgen.adapters.kernels.attention import reference_attention_lse

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(11, h, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    do = torch.randn(11, 4, 8, generator=g, dtype=torch.float64)
    pos = torch.tensor([*range(5), *range(6)])
    cu = torch.tensor([0, 5, 11])
    kp = SimpleNamespace(attention_kv_chunk=4, attention_softmax_dtype="float64")
    o, lse = reference_attention_lse(q, k, v, pos, kp, cu_seqlens_q=cu, cu_seqlens_k=cu)
    return (q, k, v, o, lse, do, pos, kp), dict(cu_seqlens_q=cu, cu_seqlens_k=cu)


def test_the_dk_plant_drops_the_scale_from_dk_only_and_is_undone_after():
    """Through the module attribute, as the trainer's attention calls it (so on any backend)."""
    from contractgen.adapters.kernels import attention
    from contractgen.adapters.kernels.planted import BUGS, planted

    args, kw = _attention_case()
    scale = args[0].shape[-1] ** -0.5
    dq, dk, dv = attention.attention_backward(*args, **kw)
    with planted([DK_BUG]):
        with planted([DK_BUG]):  # nested: patched once, not twice
            pdq, pdk, pdv = attention.attention_backward(*args, **kw)
        _, half_scale_dk, _ = attention.attention_backward(*args, **kw, scale=scale / 2)
    assert torch.equal(pdq, dq) and torch.equal(pdv, dv)
    assert torch.equal(pdk, dk / scale) and not torch.allclose(pdk, dk)
    assert not torch.allclose(half_scale_dk, pdk)  # an explicit scale is the one dropped
    after = attention.attention_backward(*args, **kw)
    assert all(torch.equal(a, b) for a, b in zip(after, (dq, dk, dv), strict=True))
    # a gradient-only bug: --inject-faults plants BUGS and expects a forward check to catch them
    assert DK_BUG not in BUGS


def test_the_dk_plant_is_the_real_bug_against_float64_autograd():
    """Honest dK is autograd's; the planted one is autograd's without the scale (what the gate's
    gradient check sees)."""
    from contractgen.adapters.kernels import attention
    from contractgen.adapters.kernels.planted import planted

    args, kw = _attention_case()
    q, k, v, _, _, do, _, _ = args
    scale = q.shape[-1] ** -0.5
    k_ = k.clone().requires_grad_(True)
    out = []
    for lo, hi in ((0, 5), (5, 11)):  # causal softmax attention per sequence, plainly
        s = torch.einsum("lhd,shd->hls", q[lo:hi], k_[lo:hi].repeat_interleave(2, dim=1)) * scale
        s = s.masked_fill(torch.ones(hi - lo, hi - lo).triu(1).bool(), float("-inf"))
        out.append(torch.einsum("hls,shd->lhd", s.softmax(-1), v[lo:hi].repeat_interleave(2, 1)))
    (torch.cat(out) * do).sum().backward()
    _, dk, _ = attention.attention_backward(*args, **kw)
    with planted([DK_BUG]):
        _, planted_dk, _ = attention.attention_backward(*args, **kw)
    assert torch.allclose(dk, k_.grad, rtol=1e-10, atol=1e-12)
    assert torch.allclose(planted_dk * scale, k_.grad, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(planted_dk, k_.grad, rtol=1e-2)


def test_an_unknown_plant_names_both_kinds():
    from contractgen.adapters.kernels.planted import planted

    with pytest.raises(ValueError, match="attention_dk_scale_dropped.*silu_glu_sign_flip"):
        with planted(["nope"]):
            pass


def _report(loss: float, at_one: float, rel: float) -> dict:
    """The smallest training report ``training.failures`` reads: one step, one layout."""
    grads = {"tolerance": 1e-4, "per_layout": [{"name": "tp1", "max_rel_diff": rel,
                                                "within_tolerance": rel <= 1e-4}]}  # fmt: skip
    entry = {"name": "tp1", "loss": loss, "loss_if_ratio_one": at_one, "weights_synced": True,
             "advantage_logprob": 0.25, "advantage_logprob_want": 0.25,
             "advantage_logprob_bound": 1e-6}  # fmt: skip
    return {"steps": [{"step": 0, "pairs": [], "ratio_max_abs_dev": 0.0, "grads": grads,
                       "per_layout": [entry]}]}  # fmt: skip


def test_training_failures_read_the_loss_identity_and_the_gradient_check():
    from contractgen.parity.training import failures

    assert failures(_report(-0.0, -0.0, 2e-6)) == []
    (off,) = failures(_report(-0.0, 0.0, 2e-6))  # the same value, other bits: not the identity
    assert off == "step 0: tp1: loss -0.0 is not its value at ratio 1, 0.0"
    (grad,) = failures(_report(1.5, 1.5, 52.7))
    assert grad == "step 0: gradients at tp1 off float64 (52.7 > 0.0001)"


@pytest.mark.slow
def test_a_dk_without_the_softmax_scale_fails_the_rl_run_at_every_layout(tmp_path):
    """The RL test's workload (its layouts, rollout TPs and lengths; one step, since the check
    is at step 0) with the bug planted on both sides: every pair exact, the ratio exactly 1, and
    still exit 1, every layout's step-0 gradient far off float64."""
    code, report, out = run_parity(
        "--train-steps", "1", *RL_RUN, "--plant-bug", DK_BUG, tmp_path=tmp_path
    )
    assert code == 1, out
    (step,) = report["steps"]
    assert step["exact"] and step["ratio_max_abs_dev"] == 0.0 and step["weights_synced"]
    assert len(step["pairs"]) == 8, "the bug is invisible to every pair"
    checked = step["grads"]["per_layout"]
    assert [g["name"] for g in checked] == ["tp1", "tp2", "pp2", "cp2"]
    assert all(not g["within_tolerance"] and g["max_rel_diff"] > 1.0 for g in checked), checked
    assert all(".self_attn.k_" in g["worst_parameter"] for g in checked), checked
    assert report["training"]["planted_bugs"] == [DK_BUG]
    assert "gradients at tp1 off float64" in out and "gradients at cp2 off float64" in out


def test_the_step_zero_check_computes_one_float64_reference_for_every_layout(monkeypatch):
    """The check reuses what it can: the float64 reference once per set of samples (every
    layout samples the same at step 0), the layout's live trainer processes for its backward
    (float32, the reference's loss, the run's planted bugs and the layout's trainer fault)."""
    from contractgen.parity import correctness
    from contractgen.parity.layouts import Layout
    from contractgen.parity.training import _GradCheck

    made = []

    def reference_of(config, sequences, prompt_lens):
        made.append((sequences, prompt_lens))
        grads = {"w": torch.tensor([1.0, -2.0]), "b": torch.tensor([0.5])}
        return correctness.GradReference(sequences, prompt_lens, grads)

    monkeypatch.setattr(correctness, "grad_reference_of", reference_of)

    class Trainer:  # a layout's live session: what it was asked to run, and a gradient
        def __init__(self, off: float) -> None:
            self.off, self.runs = off, []

        def logprobs(self, sequences, run):
            self.runs.append((sequences, run))
            grads = {"w": torch.tensor([1.0, -2.0 + self.off]), "b": torch.tensor([0.5])}
            return SimpleNamespace(hf_grads=grads)

    config = SimpleNamespace(planted_bugs=(DK_BUG,))
    run = SimpleNamespace(config=config, trainer_adapter=SimpleNamespace())  # GRADIENT_RUN unset
    check = _GradCheck(run, note=None)
    base = SimpleNamespace(sequences=[[1, 2, 3], [4, 5, 6, 7]], prompt_lens=[2, 3])
    near, far = Trainer(2e-5), Trainer(0.5)
    ok = check.layout(near, Layout(1, 1, 1), base, fault="trainer fault")
    off = check.layout(far, Layout(2, 1, 1), base, fault=None)
    assert len(made) == 1, "one float64 reference for both layouts"
    assert ok["within_tolerance"] and ok["max_rel_diff"] == pytest.approx(1e-5, rel=1e-2)
    assert not off["within_tolerance"] and off["worst_parameter"] == "w"
    ((seqs, run),) = near.runs
    assert seqs == [[1, 2, 3], [4, 5, 6, 7]] and run.grads and run.dtype_override == "float32"
    assert run.prompt_lens == (2, 3) and run.planted_bugs == (DK_BUG,)
    assert run.fault == "trainer fault" and far.runs[0][1].fault is None
    report = check.report([{"grads": ok}, {"grads": off}, {"grads": None}])
    assert report["per_layout"] == [ok, off] and report["note"] is None
    # without transformers: no layout checked, the note says why
    none = _GradCheck(SimpleNamespace(config=config), note="transformers is not installed")
    assert none.layout(near, Layout(1, 1, 1), base, fault=None) is None and len(near.runs) == 1
