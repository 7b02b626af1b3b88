"""The sampler: draws against the processed distribution (chi-square), the logprob it reports,
the kept sets of top-k / top-p, and per-sample seeds on the reference model."""

from __future__ import annotations

import math

import pytest
import torch

from contractgen.adapters.common.draw import (
    SamplingParams,
    draw,
    draw_key,
    draw_keys,
    hash_bits,
    keep_mask,
    process,
    process_shard,
    sample,
    sample_rows,
    scale,
)
from contractgen.adapters.kernels.logsoftmax import full_logprobs, token_logprobs
from contractgen.adapters.sglang.engine import Request, RolloutEngine
from contractgen.adapters.sglang.model import ModelArch, ReferenceModel, random_weights
from contractgen.parity.workload import sample_seed

V = 12
DRAWS = 6_000
# z for a one-sided 1e-6 tail: the chi-square bound below is its Wilson-Hilferty quantile, so an
# honest sampler exceeds it with probability ~1e-6 (and the draws are seeded: it never flakes).
Z_1E6 = 4.753


def chi2_bound(df: int) -> float:
    """The chi-square quantile at 1 - 1e-6 (Wilson-Hilferty), for ``df`` degrees of freedom."""
    a = 2 / (9 * df)
    return df * (1 - a + Z_1E6 * math.sqrt(a)) ** 3


def expected(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The processed distribution, written independently: softmax(x / T) in float64, the top-k
    most likely (ties: lower id), renormalised, then the smallest prefix reaching top_p."""
    probs = torch.softmax(logits.double() / p.temperature, -1)
    order = sorted(range(V), key=lambda i: (-float(probs[i]), i))
    kept = order[: p.top_k] if p.top_k > 0 else order
    mass = sum(float(probs[i]) for i in kept)
    prefix, acc = [], 0.0
    for i in kept:
        if acc >= p.top_p:
            break
        prefix.append(i)
        acc += float(probs[i]) / mass
    out = torch.zeros(V, dtype=torch.float64)
    out[prefix] = probs[prefix]
    return out / out.sum()


def chi2(counts: torch.Tensor, want: torch.Tensor) -> float:
    support = want > 0
    n = float(counts.sum())
    e = want[support] * n
    return float(((counts[support].double() - e) ** 2 / e).sum())


LOGITS = torch.tensor([2.1, -0.3, 0.9, 1.7, 0.9, -1.2, 0.2, 1.1, -0.6, 0.4, 1.4, -2.0])
CASES = [
    SamplingParams(temperature=0.5),
    SamplingParams(temperature=1.3),
    SamplingParams(temperature=0.9, top_k=4),
    SamplingParams(temperature=1.0, top_p=0.7),
    SamplingParams(temperature=0.8, top_k=8, top_p=0.85),
]


def _counts(kp, p: SamplingParams, seed: int = 0, wrong_temperature: bool = False):
    """``DRAWS`` draws from ``p``'s processed logprobs of ``LOGITS``."""
    lp_params = SamplingParams(1.0, p.top_k, p.top_p) if wrong_temperature else p
    lp = full_logprobs(process(LOGITS[None], lp_params, kp), kp, V)[0]
    counts = torch.zeros(V, dtype=torch.int64)
    for i in range(DRAWS):  # the draws of one request: its seed, indices 0, 1, ...
        counts[draw(lp, p, seed, i)] += 1
    return counts


@pytest.mark.parametrize("p", CASES, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
def test_draws_follow_the_processed_distribution(kp32, p):
    want = expected(LOGITS, p)
    counts = _counts(kp32, p)
    assert int(counts[want == 0].sum()) == 0, "a token outside the kept set was drawn"
    df = int((want > 0).sum()) - 1
    assert df >= 2
    assert chi2(counts, want) < chi2_bound(df)


@pytest.mark.parametrize("p", [CASES[0], CASES[3]], ids=["T0.5", "top_p0.7"])
def test_a_sampler_that_ignores_the_temperature_fails_the_chi_square(kp32, p):
    """The same bound rejects draws at temperature 1 where ``p`` says otherwise (the test has
    the power to see the planted bug the gate must also catch)."""
    want = expected(LOGITS, SamplingParams(0.7, p.top_k, p.top_p))
    counts = _counts(kp32, SamplingParams(0.7, p.top_k, p.top_p), wrong_temperature=True)
    df = int((want > 0).sum()) - 1
    assert chi2(counts, want) > chi2_bound(df)


def test_kept_sets_of_top_k_and_top_p(kp32):
    x = scale(LOGITS[None], SamplingParams(1.0), kp32)
    ranked = [0, 3, 10, 7, 2, 4, 9, 6, 1, 8, 5, 11]  # LOGITS by value; the tie 2/4: lower id first
    top3 = keep_mask(x, SamplingParams(1.0, top_k=3))[0]
    assert top3.nonzero()[:, 0].tolist() == sorted(ranked[:3])
    tie = keep_mask(x, SamplingParams(1.0, top_k=5))[0]
    assert bool(tie[2]) and not bool(tie[4])
    assert keep_mask(x, SamplingParams(1.0, top_p=1e-9))[0].nonzero()[:, 0].tolist() == [0]
    assert bool(keep_mask(x, SamplingParams(1.0))[0].all())
    assert keep_mask(x, SamplingParams(0.0, top_k=1))[0].all(), "greedy never truncates"


def _kept_by_hand(row: list[float], top_k: int, top_p: float) -> set[int]:
    """The kept set written out: ids ranked by (value descending, id ascending), the first
    ``top_k``, then the shortest prefix whose renormalised mass before each token is < top_p."""
    ranked = sorted(range(len(row)), key=lambda i: (-row[i], i))
    if top_k > 0:
        ranked = ranked[:top_k]
    if top_p >= 1:
        return set(ranked)
    w = [math.exp(row[i] - row[ranked[0]]) for i in ranked]
    total, before, kept = math.fsum(w), 0.0, set()
    for i, wi in zip(ranked, w, strict=True):
        if before / total >= top_p:
            break
        kept.add(i)
        before += wi
    return kept


DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("device", DEVICES)
def test_kept_sets_on_every_device_match_the_sets_written_out(device):
    """Rows of a 2,000-token vocab drawn from 24 values (every kept set cut inside a run of
    ties), bf16 as the sampler sees them: the same mask on the row's own device as by hand."""
    g = torch.Generator().manual_seed(11)
    rows = (torch.randint(0, 24, (6, 2000), generator=g) / 4.0).to(torch.bfloat16)
    for top_k, top_p in ((1, 1.0), (7, 1.0), (300, 1.0), (-1, 0.5), (-1, 0.97), (40, 0.6)):
        mask = keep_mask(rows.to(device), SamplingParams(1.0, top_k=top_k, top_p=top_p))
        assert mask.device.type == "cpu"
        for r in range(rows.shape[0]):
            want = _kept_by_hand(rows[r].double().tolist(), top_k, top_p)
            assert set(mask[r].nonzero()[:, 0].tolist()) == want, (top_k, top_p, r)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_top_p_set_does_not_depend_on_the_rows_beside_it(threads):
    """The rollout asks for one row's kept set, the trainer for many rows at once: the same set
    for every row either way, at any thread count. Checked at top-p values on the boundaries
    themselves (each row's own renormalised masses) and at one found by search where a lone
    row's ``sum`` (split over threads) kept a token the batch's did not."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.randn(4, 151_936, generator=torch.Generator().manual_seed(1)) * 2
        w = torch.exp(x.double().sort(-1, descending=True).values - x.double().amax(-1)[:, None])
        masses = (w.cumsum(-1) / w.sum(-1, keepdim=True))[:, :6].flatten().tolist()
        for top_p in (0.013272614084227464, *masses):
            p = SamplingParams(1.0, top_p=top_p)
            alone = torch.cat([keep_mask(x[i : i + 1], p) for i in range(len(x))])
            assert torch.equal(keep_mask(x, p), alone), top_p
    finally:
        torch.set_num_threads(before)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the lent H200)")
def test_kept_sets_on_cuda_are_the_cpus_bit_for_bit():
    """A Qwen3-size vocab row (151,936) with ties, sorted on the GPU: the same mask as the CPU's."""
    g = torch.Generator().manual_seed(12)
    rows = (torch.randn(8, 151_936, generator=g) * 2).to(torch.bfloat16)
    for p in (SamplingParams(1.0, top_k=40), SamplingParams(0.8, top_p=0.9),
              SamplingParams(1.0, top_k=1000, top_p=0.5)):  # fmt: skip
        assert torch.equal(keep_mask(rows.cuda(), p), keep_mask(rows, p)), p


def test_reported_logprob_is_the_drawn_tensors_entry(kp):
    """``sample``'s logprob is the processed distribution's entry for the drawn token, bitwise the
    contract kernel's ``token_logprobs`` of the processed logits (what re-score and trainer run);
    temperature 1 leaves the logits' bits unchanged."""
    logits = torch.randn(V, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    for p in CASES:
        tok, lp = sample(logits, p, kp, V, 5, 0)
        again = token_logprobs(process(logits[None], p, kp), torch.tensor([tok]), kp, V)[0]
        assert lp.dtype == again.dtype and torch.equal(
            lp.view(torch.int16), again.view(torch.int16)
        )
    plain = scale(logits[None], SamplingParams(1.0), kp)
    assert torch.equal(plain.view(torch.int16), logits[None].to(plain.dtype).view(torch.int16))
    hot = token_logprobs(process(logits[None], CASES[0], kp), torch.tensor([0]), kp, V)
    assert not torch.equal(hot, token_logprobs(logits[None], torch.tensor([0]), kp, V))


def _lowbias32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x21F0AAAD) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 0x735A2D97) & 0xFFFFFFFF
    return h ^ (h >> 15)


def test_noise_bits_are_the_hash_written_out_in_python_ints():
    """The int64 tensor hash is the 32-bit hash computed with Python's exact integers (no
    product wraps in int64), for large and small keys and the last token id of a Qwen3 vocab."""
    keys = [draw_key(seed, i) for seed in (0, 1, 2**63 - 1) for i in (0, 7, 255)]
    ids = [0, 1, 2, 77_777, 151_935]
    bits = hash_bits(torch.tensor(keys), 151_936)
    for b, (k1, k2) in enumerate(keys):
        for v in ids:
            want = _lowbias32(_lowbias32(_lowbias32((v * 0x9E3779B1) & 0xFFFFFFFF) ^ k1) ^ k2)
            assert int(bits[b, v]) == want
    assert bits.min() >= 0 and bits.max() < 2**32
    assert len({draw_key(5, i) for i in range(1000)}) == 1000


# one step's rows: mixed params (greedy, temperature, top-k, top-p; several rows per group)
ROW_PARAMS = [CASES[0], SamplingParams(0.0), CASES[2], CASES[0], CASES[4], SamplingParams(1.0),
              CASES[2], CASES[3]]  # fmt: skip


def _batched_rows(kp, sampler):
    """``sampler(logits, params, keys)`` over one batch of rows and over each row alone:
    ``(batched tokens, lone tokens, batched logprob bits, lone logprob bits)``."""
    V_big = 3_001  # a vocab of several log-softmax chunks, not a multiple of any block
    logits = torch.randn(len(ROW_PARAMS), V_big, generator=torch.Generator().manual_seed(9)) * 3
    logits = logits.to(torch.bfloat16)
    keys = draw_keys([draw_key(sample_seed(0, 1, b, 0), b % 3) for b in range(len(ROW_PARAMS))])
    tok, lp = sampler(logits, ROW_PARAMS, keys, kp, V_big)
    alone = [sampler(logits[b : b + 1], [p], keys[b : b + 1], kp, V_big)
             for b, p in enumerate(ROW_PARAMS)]  # fmt: skip
    lone_tok = torch.cat([t for t, _ in alone])
    lone_lp = torch.cat([x for _, x in alone])
    int_t = {2: torch.int16, 4: torch.int32}[lp.element_size()]
    return tok, lone_tok, lp.view(int_t), lone_lp.view(int_t)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_draw_and_logprob_are_its_lone_computations_bit_for_bit(kp, threads):
    """``sample_rows`` over a step's rows (several params groups) gives every row the token and
    logprob bits it gets alone: the log-softmax is batch invariant and the noise is keyed by
    the row's own request, never by its place in the batch."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        tok, lone_tok, lp, lone_lp = _batched_rows(kp, sample_rows)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(tok, lone_tok) and torch.equal(lp, lone_lp)
    assert len(set(tok.tolist())) > 3  # not a degenerate draw
    # the reported logprob is the entry of the full processed log-softmax at the drawn token
    for b, p in enumerate(ROW_PARAMS):
        x = torch.randn(len(ROW_PARAMS), 3_001, generator=torch.Generator().manual_seed(9)) * 3
        full = full_logprobs(process(x.to(torch.bfloat16)[b : b + 1], p, kp), kp, 3_001)[0]
        assert torch.equal(full[tok[b]].view(torch.int16), lp[b].view(torch.int16)[None][0])


def test_a_sampler_with_one_shared_generator_fails_the_lone_row_check(kp):
    """The check above has power: noise drawn for the batch from one generator in row order
    (the obvious batched sampler) gives a row other noise alone than in the batch."""

    def shared_generator(logits, params, keys, kp, vocab_size):
        gen = torch.Generator().manual_seed(0)
        lp = torch.cat([full_logprobs(process(logits[b : b + 1], p, kp), kp, vocab_size)
                        for b, p in enumerate(params)])  # fmt: skip
        u = torch.rand(lp.shape, generator=gen, dtype=torch.float64)
        tok = torch.argmax(lp.double() - torch.log(-torch.log(u)), dim=-1)
        return tok, lp.gather(-1, tok[:, None])[:, 0]

    tok, lone_tok, lp, lone_lp = _batched_rows(kp, shared_generator)
    assert not torch.equal(tok, lone_tok)


def test_a_batch_wide_log_softmax_fails_the_lone_row_check(kp):
    """...and sees a log-softmax whose bits depend on the other rows (shifted by the batch's
    mean, a float32 rounding that moves with the rows beside it)."""

    def batch_max(logits, params, keys, kp, vocab_size):
        x = logits[:, :vocab_size].float() / 3.7
        lp = torch.log_softmax(x - x.mean(), dim=-1)
        tok = torch.argmax(lp, dim=-1)
        return tok, lp.gather(-1, tok[:, None])[:, 0]

    tok, lone_tok, lp, lone_lp = _batched_rows(kp, batch_max)
    assert not torch.equal(lp, lone_lp)


def test_a_vocab_shard_is_processed_as_its_columns_of_the_whole_row(kp):
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(4))
    """Temperature is elementwise (a shard's columns equal the whole row's); a truncating shard
    needs the whole row (gathered over TP in the trainer; here TP=1, one shard)."""
    for p in CASES:
        whole = process(logits, p, kp)
        assert torch.equal(process_shard(logits, p, kp, 0, V), whole)
        if not p.truncates:
            for lo in (0, 4, 8):
                shard = process_shard(logits[:, lo : lo + 4], p, kp, lo, V)
                assert torch.equal(shard, whole[:, lo : lo + 4])


def test_sampling_params_are_checked():
    with pytest.raises(ValueError, match="top_p in"):
        SamplingParams(1.0, top_p=0.0)
    with pytest.raises(ValueError, match="finite"):
        SamplingParams(float("nan"))


# ---- per-sample seeds on the reference model ----------------------------------------------------
@pytest.fixture(scope="module")
def engine(profile, kp, runtime_policy):
    arch = ModelArch.from_profile(profile)
    model = ReferenceModel(arch, random_weights(arch, seed=0), kp, runtime_policy(1))
    return RolloutEngine(model, progress=False)


def _samples(engine, seeds, temperature=1.0):
    prompt = tuple(range(40, 70))
    reqs = [Request(f"s{j}", prompt, 6, temperature, seed) for j, seed in enumerate(seeds)]
    out = engine.generate(reqs)
    return [(out[r.rid].tokens, out[r.rid].logprob_tensor().view(torch.int16)) for r in reqs]


def test_per_sample_seeds_differ_and_reproduce(engine):
    """The n samples of a prompt get seeds from (base, step, prompt, sample): they differ, and
    a re-run (a fresh engine's generators) reproduces them bit for bit, logprobs included."""
    seeds = [sample_seed(7, 2, 0, j) for j in range(4)]
    assert len(set(seeds)) == 4
    assert sample_seed(7, 2, 0, 1) != sample_seed(7, 3, 0, 1) != sample_seed(8, 2, 0, 1)
    first, again = _samples(engine, seeds), _samples(engine, seeds)
    assert len({tuple(tokens) for tokens, _ in first}) == 4, "samples of one prompt must differ"
    for (t1, lp1), (t2, lp2) in zip(first, again, strict=True):
        assert t1 == t2 and torch.equal(lp1, lp2)
    one_seed = _samples(engine, [seeds[0]] * 4)  # an engine falling back to one seed
    assert len({tuple(tokens) for tokens, _ in one_seed}) == 1
