"""On-policy sampling in the gate: the sampler's logprobs against the trainer's (``sampling[]``,
``three_way``), planted sampling bugs that parity alone passes, and the trainer's temperature.

The planted runs monkeypatch the rollout in this process: the gate runs in-process
(``run_parity_in_process``) and its TP=1 CPU rollout runs here, while the trainer's ranks start
from a fork server that never sees the patch, so each bug is on the rollout side only.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import V1, V2, run_parity, run_parity_in_process

import contractgen.adapters.sglang.engine as engine_mod
import contractgen.adapters.sglang.model as model_mod
from contractgen.adapters.common.draw import SamplingParams

pytestmark = pytest.mark.slow

CHEAP = ("--layouts", "tp1", "--rollout-tps", "1", "--no-reference")


@pytest.fixture(scope="module")
def honest_v1(tmp_path_factory):
    return run_parity_in_process("--contract", V1, *CHEAP, tmp_path=tmp_path_factory.mktemp("h"))


def _decode_position_error(monkeypatch):
    """Decode steps put their query one position late (RoPE): prefill and re-score are right."""
    forward, rope = model_mod.ReferenceModel.forward, model_mod.rope_cos_sin

    def shifted_forward(self, input_ids, caches, lengths, **kw):
        decode = [int(c.length > 0) for c in caches]  # a request with cached tokens decodes
        shift = torch.cat([torch.full((n,), d) for d, n in zip(decode, lengths, strict=True)])
        model_mod.rope_cos_sin = lambda pos, *a, **k: rope(pos + shift.to(pos.device), *a, **k)
        try:
            return forward(self, input_ids, caches, lengths, **kw)
        finally:
            model_mod.rope_cos_sin = rope

    monkeypatch.setattr(model_mod.ReferenceModel, "forward", shifted_forward)


def _temperature_ignored(monkeypatch):
    """The sampler draws at temperature 1 whatever the request says (and reports what it saw)."""
    sample_rows = engine_mod.sample_rows

    def at_one(logits, params, *a, **k):
        params = [p if p.greedy else dataclasses.replace(p, temperature=1.0) for p in params]
        return sample_rows(logits, params, *a, **k)

    monkeypatch.setattr(engine_mod, "sample_rows", at_one)


def test_honest_v1_sampling_is_reported_and_passes(honest_v1):
    code, report, out = honest_v1
    assert code == 0, out
    entries = report["sampling"]
    assert [e["rid"] for e in entries] == ["r0", "r1", "r2", "r3"]
    assert {(e["temperature"], e["top_k"], e["top_p"]) for e in entries} >= {
        (0.8, 40, 1.0),
        (1.0, -1, 0.9),
    }, "the default workload samples at T != 1, with top-k and with top-p"
    for e in entries:
        assert e["within_bound"] and e["bound"] == 0.05
        assert len(e["sampler_logprobs"]) == len(e["tokens"]) == len(e["trainer_logprobs"]) == 10
    tw = report["three_way"]
    assert tw["per_layout"][0]["tokens"] == 40 and tw["mismatch_count"] == 0


@pytest.mark.parametrize(
    "plant", [_decode_position_error, _temperature_ignored], ids=["decode_rope", "no_temperature"]
)
def test_v1_planted_sampling_bug_fails_the_default_gate(plant, honest_v1, monkeypatch, tmp_path):
    """Under v1 the trainer is compared with the re-score, which both bugs leave right: the pairs
    stay exact, and only the sampler-vs-trainer check sees that the tokens were drawn from
    another distribution than the one scored."""
    assert honest_v1[0] == 0, honest_v1[2]
    plant(monkeypatch)
    code, report, out = run_parity_in_process("--contract", V1, *CHEAP, tmp_path=tmp_path)
    assert code == 1, out
    assert all(p["exact"] for p in report["pairs"]), "parity with the re-score is not what fails"
    off = [e for e in report["sampling"] if not e["within_bound"]]
    assert off and all(e["max_abs_diff"] > 0.05 for e in off)
    assert report["three_way"]["per_layout"][0]["decode_vs_trainer"] > 0
    assert "sampler logprob off the trainer's" in out


def test_v2_sampling_must_be_bitwise(monkeypatch, tmp_path):
    """Under v2 the sampler's logprob is the one trained on: bitwise, honest and planted."""
    code, report, out = run_parity_in_process("--contract", V2, *CHEAP, tmp_path=tmp_path)
    assert code == 0, out
    assert all(e["exact"] and e["bound"] == 0.0 for e in report["sampling"])
    _temperature_ignored(monkeypatch)
    code, report, out = run_parity_in_process("--contract", V2, *CHEAP, tmp_path=tmp_path)
    assert code == 1, out
    assert [e["rid"] for e in report["sampling"] if not e["exact"]] == ["r1"]  # the T=0.8 one


def test_trainer_scores_the_processed_distribution(reference_weights):
    """At T != 1, top-k and top-p the trainer (TP=2: the truncated rows gathered over the vocab
    shards) scores each sequence's processed distribution bit for bit as the rollout's re-score
    does, and not the logits' distribution."""
    from contractgen.adapters.common.run_types import TrainBatch, TrainInit
    from contractgen.adapters.megatron.trainer import TrainerRun, TrainerSession
    from contractgen.adapters.sglang.engine import Request, RolloutEngine
    from contractgen.adapters.sglang.model import ReferenceModel
    from contractgen.adapters.sglang.session import policies

    arch, weights = reference_weights
    _, kp, rp = policies(V1, 1, None, {}, {})
    engine = RolloutEngine(ReferenceModel(arch, weights, kp, rp), progress=False)
    params = (SamplingParams(0.7, top_k=30), SamplingParams(1.3, top_p=0.8))
    prompts = (tuple(range(5, 25)), tuple(range(300, 313)))
    requests = [
        Request(f"q{i}", prompt, 12, p.temperature, seed=i, top_k=p.top_k, top_p=p.top_p)
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True))
    ]
    done = engine.generate(requests)
    seqs = [done[r.rid].sequence for r in requests]  # sampled: every token in its kept set
    want = [engine.rescore(s, params=p) for s, p in zip(seqs, params, strict=True)]
    plain = [engine.rescore(s) for s in seqs]
    prompt_lens = tuple(len(p) for p in prompts)
    assert all(
        bool(torch.isfinite(w[n - 1 :]).all()) for w, n in zip(want, prompt_lens, strict=True)
    )
    with TrainerSession(V1, weights, (2, 1, 1)) as session:
        got = session.logprobs(seqs, TrainerRun(sampling=params)).logprobs
        session.train(TrainInit())
        step = session.train(
            TrainBatch(
                tuple(map(tuple, seqs)),
                prompt_lens,
                tuple(w[n - 1 :] for w, n in zip(want, prompt_lens, strict=True)),
                (1.0, -1.0),
                sampling=params,
            )  # fmt: skip
        )
    for g, w, p in zip(got, want, plain, strict=True):
        assert g.dtype == w.dtype and torch.equal(g.view(torch.int16), w.view(torch.int16))
        assert not torch.equal(g, p)
    # the training forward (the loss's logprobs, before the update) scores the same bits
    for g, w, n in zip(step.logprobs, want, prompt_lens, strict=True):
        assert torch.equal(g.view(torch.int16), w[n - 1 :].view(torch.int16))
    assert step.ratio_max_abs_dev == 0.0


def test_rl_loop_at_temperature_is_exact(tmp_path):
    """``--train-steps --train-temperature 0.7``: the rollout samples and every side scores at
    0.7, so the pairs are exact, the ratio is 1 and the three-way check sees no mismatch."""
    code, report, out = run_parity_in_process(
        "--train-steps", "1", "--train-temperature", "0.7", *CHEAP[:4], "--no-grad-check",
        tmp_path=tmp_path,
    )  # fmt: skip
    assert code == 0, out
    assert report["training"]["temperature"] == 0.7
    (step,) = report["steps"]
    assert step["exact"] and step["ratio_max_abs_dev"] == 0.0
    tw = step["three_way"]["per_layout"][0]
    assert tw["tokens"] == 80 and tw["mismatch_count"] == 0 and tw["same_weights"]


def test_rl_step_on_other_weights_fails_the_three_way(tmp_path):
    """A rollout rank that keeps an old shard samples on other weights than the trainer scores:
    step 0 (a full first push) agrees, step 1's weights digests differ and the step fails."""
    code, report, out = run_parity(
        "--train-steps", "2", *CHEAP[:4], "--no-grad-check", "--train-fault", "sync.stale_shard",
        tmp_path=tmp_path,
    )  # fmt: skip
    assert code == 1, out
    first, second = (s["three_way"]["per_layout"][0] for s in report["steps"])
    assert first["same_weights"] and first["rollout_weights"]["tp1"]["version"] == 0
    assert first["trainer_weights"]["digest"] == first["rollout_weights"]["tp1"]["digest"]
    assert not second["same_weights"] and second["trainer_weights"]["version"] == 1
    assert second["trainer_weights"]["digest"] != first["trainer_weights"]["digest"]
    assert "sampled on other weights than the trainer scored" in out
