"""Reference rollout: HF transformers agreement, checkpoint dialects, batch/decode invariance."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from contractgen.adapters.common.checkpoint import (
    CheckpointError,
    dims_from_hf_config,
    load_checkpoint,
    read_hf_config,
)
from contractgen.adapters.sglang.engine import Request, RolloutEngine
from contractgen.adapters.sglang.model import (
    KVCache,
    KVPool,
    ModelArch,
    ReferenceModel,
    random_weights,
)
from contractgen.parity.harness import bits

HF_CONFIGS = {
    "gqa_tied": dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True
    ),
    "gqa_untied_kv1": dict(
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, tie_word_embeddings=False
    ),
    "mha_untied_linear_rope": dict(
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0},
    ),
}


def _hf_model(tmp_path, name, seed=0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    kw = dict(HF_CONFIGS[name])
    kw.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": 10000.0})
    cfg = Qwen3Config(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        initializer_range=0.1,
        **kw,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norm weights
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(tmp_path / name)
    return model, tmp_path / name


def _profile_for(profile, path):
    """The v1 profile widened to cover a tiny test checkpoint (family fields from its config)."""
    from contractgen.adapters.common.checkpoint import hf_config_fields

    cfg = read_hf_config(path)
    f = hf_config_fields(cfg, profile.family)
    template = dataclasses.replace(profile.reference_model, name="tiny")
    dims = dims_from_hf_config(cfg, template, profile.family)
    return dataclasses.replace(profile, checkpoints=(dims,), norm_eps=f["norm_eps"])


def _engine(arch, weights, kp, rp, **kw):
    return RolloutEngine(ReferenceModel(arch, weights, kp, rp), progress=False, **kw)


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_hf_transformers_qwen3_agreement_float32(tmp_path, profile, kp32, runtime_policy, name):
    hf, path = _hf_model(tmp_path, name)
    arch, weights = load_checkpoint(path, _profile_for(profile, path))
    eng = _engine(arch, weights, kp32, runtime_policy(1))
    seq = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([seq])).logits[0]
    ours = eng.logits(seq)
    assert ours.dtype == torch.float32
    rel = (ours - ref).abs().max() / ref.abs().max()
    assert rel <= 1e-5, rel
    # greedy continuation: same tokens as HF's greedy loop
    prompt, cur = seq[:6], list(seq[:6])
    with torch.no_grad():
        for _ in range(8):
            cur.append(int(hf(torch.tensor([cur])).logits[0, -1].argmax()))
    got = eng.generate([Request("r", tuple(prompt), 8)])["r"]
    assert got.tokens == cur[6:]


def test_checkpoint_config_dialects_and_sharding(tmp_path, profile, kp32, runtime_policy):
    from transformers import Qwen3ForCausalLM

    hf, path = _hf_model(tmp_path, "mha_untied_linear_rope")
    prof = _profile_for(profile, path)
    arch5, w5 = load_checkpoint(path, prof)
    # transformers 4.x dialect: rope_theta + rope_scaling at top level
    cfg = read_hf_config(path)
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params.pop("rope_theta")
    cfg["rope_scaling"] = {"type": params["rope_type"], "factor": params["factor"]}
    (path / "config.json").write_text(json.dumps(cfg))
    arch4, _ = load_checkpoint(path, prof)
    assert arch4 == arch5
    assert dict(arch5.rope_scaling) == {"factor": 2.0, "type": "linear"}
    # sharded safetensors with an index file
    sharded = tmp_path / "sharded"
    Qwen3ForCausalLM.from_pretrained(path).save_pretrained(sharded, max_shard_size="60KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    arch_s, w_s = load_checkpoint(sharded, prof)
    assert arch_s == arch5 and set(w_s) == set(w5)
    assert all(torch.equal(w_s[k], w5[k]) for k in w5)


def test_checkpoint_not_covered_is_refused(tmp_path, profile):
    _, path = _hf_model(tmp_path, "gqa_tied")
    with pytest.raises(CheckpointError, match=r"config\.json: not covered by the qwen3_dense") as e:
        load_checkpoint(path, profile)  # the real v1 profile: no 64-wide Qwen3
    assert "hidden_size=64" in str(e.value) and "rope_theta" in str(e.value)
    cfg = read_hf_config(path)
    cfg["architectures"] = ["LlamaForCausalLM"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="hf_architecture='LlamaForCausalLM'"):
        load_checkpoint(path, _profile_for(profile, path))


def test_weights_of_wrong_shape_are_refused(profile, kp, runtime_policy):
    arch = ModelArch.from_profile(profile)
    w = random_weights(arch)
    w["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3)
    want = rf"mlp\.up_proj\.weight: \(3, 3\) \(expected \({arch.intermediate_size}, {arch.hidden_size}\)\)"
    with pytest.raises(ValueError, match=want):
        ReferenceModel(arch, w, kp, runtime_policy(1))


# ---- rollout invariances on the contract's reference model (bf16, the public v1) ---------------
MIX = [
    Request("a", tuple(range(1, 6)), 7),
    Request("b", tuple(range(20, 60)), 5, temperature=1.0, seed=3, arrival_step=2),
    Request("c", (7,), 9, arrival_step=1),
    Request("d", tuple(range(200, 270)), 4, temperature=0.7, seed=11, arrival_step=0),
    Request("e", tuple(range(400, 433)), 6, arrival_step=5),
]


@pytest.fixture(scope="module")
def ref_model(profile, kp, runtime_policy):
    arch = ModelArch.from_profile(profile)
    return arch, random_weights(arch, seed=0)


def _lp(c):
    return c.logprob_tensor()


def test_batch_invariance_under_request_mixes(ref_model, kp_dtype, runtime_policy):
    kp, _ = kp_dtype
    eng = _engine(*ref_model, kp, runtime_policy(1))
    mixed = eng.generate(MIX)
    other_mix = eng.generate(
        [dataclasses.replace(r, arrival_step=3 - min(3, r.arrival_step)) for r in MIX]
    )
    for r in MIX:
        alone = eng.generate([dataclasses.replace(r, arrival_step=0)])[r.rid]
        assert alone.tokens == mixed[r.rid].tokens == other_mix[r.rid].tokens, r.rid
        assert torch.equal(_lp(alone), _lp(mixed[r.rid])), r.rid
        assert torch.equal(_lp(alone), _lp(other_mix[r.rid])), r.rid
    assert mixed["a"].finish_step != mixed["d"].finish_step


def test_decode_logprobs_equal_prefill_rescore(ref_model, kp_dtype, runtime_policy):
    kp, _ = kp_dtype
    eng = _engine(*ref_model, kp, runtime_policy(1))
    out = eng.generate(MIX)
    for r in MIX:
        c = out[r.rid]
        assert _lp(c).dtype == getattr(torch, kp.logsoftmax_dtype)
        rescored = eng.rescore(c.sequence, params=r.sampling)  # the distribution it sampled
        assert torch.equal(rescored[len(c.prompt) - 1 :], _lp(c)), r.rid


@pytest.mark.parametrize("block_rows", [None, 7])
def test_packed_rescore_equals_one_prefill_per_sequence(
    ref_model, kp_dtype, runtime_policy, block_rows, monkeypatch
):
    """The gate re-scores every finished rollout in one packed prefill: each sequence's bits must
    be those of its own prefill (sequences of different lengths, one across a KV chunk), also
    when its logits are made ``block_rows`` rows at a time (what a long step's re-score does)."""
    import contractgen.adapters.sglang.engine as engine_mod

    kp, _ = kp_dtype
    eng = _engine(*ref_model, kp, runtime_policy(1))
    out = eng.generate(MIX)
    seqs = [out[r.rid].sequence for r in MIX]
    params = [r.sampling for r in MIX]
    assert len({len(s) for s in seqs}) > 1
    if block_rows is not None:
        vocab = eng.model.arch.vocab_size
        monkeypatch.setattr(engine_mod, "_HEAD_BLOCK_ELEMENTS", block_rows * vocab)
        assert any(len(s) - 1 > block_rows for s in seqs)
    for packed, seq, p in zip(eng.rescore_many(seqs, params), seqs, params, strict=True):
        assert torch.equal(bits(packed), bits(eng.rescore(seq, params=p)))


def test_twin_stock_engine_breaks_batch_and_decode_invariance(ref_model, kp32, generated):
    """The contract off (``DEFAULT_RUNTIME_POLICY``: plain GEMMs, fused paths), float32 numerics
    (bf16 rounding of the outputs can hide the CPU GEMM's reordering; fp32 cannot)."""
    eng = _engine(*ref_model, kp32, generated.runtime_policy.DEFAULT_RUNTIME_POLICY)
    out = eng.generate(MIX)
    diffs = 0
    for r in MIX:
        c = out[r.rid]
        rescored = eng.rescore(c.sequence, params=r.sampling)
        diffs += not torch.equal(rescored[len(c.prompt) - 1 :], _lp(c))
        alone = eng.generate([dataclasses.replace(r, arrival_step=0)])[r.rid]
        diffs += alone.tokens != c.tokens or not torch.equal(_lp(alone), _lp(c))
    assert diffs > 0


@pytest.mark.parametrize(
    "switch,effective",
    [
        ("force_bfloat16_dense_tensor_math", True),
        ("force_bfloat16_lm_head", True),
        ("disable_fused_qk_norm_mrope", True),
        # cross-rank switches: no-ops with one rank (the generated policy only sets them for TP>1)
        ("tp_invariant_row_linear", False),
        ("deterministic_tree_all_reduce", False),
        ("disable_flashinfer_allreduce_fusion", False),
    ],
)
def test_runtime_switch_fault_injection_tp1(ref_model, kp, runtime_policy, switch, effective):
    rp = runtime_policy(2)  # every switch on
    seq = list(range(1, 60))
    base = _engine(*ref_model, kp, rp).rescore(seq)
    faulty = _engine(*ref_model, kp, dataclasses.replace(rp, **{switch: False})).rescore(seq)
    assert torch.equal(base, faulty) is not effective


def test_layer_outputs_and_progress_line(ref_model, kp, runtime_policy, capsys, monkeypatch):
    from contractgen.adapters.sglang import engine as engine_mod

    arch = ref_model[0]
    eng = RolloutEngine(ReferenceModel(*ref_model, kp, runtime_policy(1)), progress=True)
    layers: list = []
    eng.rescore(list(range(10)), layer_outputs=layers)
    assert len(layers) == arch.num_layers and layers[0].shape == (10, arch.hidden_size)
    monkeypatch.setattr(engine_mod._Progress, "__init__", _eager_progress_init)
    eng.generate([Request("p", (1, 2, 3), 3)])
    assert "rollout: step" in capsys.readouterr().err


def _eager_progress_init(self, label, enabled=True, after=0.0, every=0.0):
    self.label, self.enabled, self.after, self.every = label, enabled, 0.0, 0.0
    self.t0 = self.last = 0.0


def test_requests_the_model_cannot_serve_are_refused(ref_model, kp, runtime_policy):
    eng = _engine(*ref_model, kp, runtime_policy(1))
    limit = ref_model[0].max_position_embeddings
    with pytest.raises(ValueError, match="request 'x': prompt 3 \\+ max_new_tokens .* exceeds"):
        eng.generate([Request("x", (1, 2, 3), limit)])
    with pytest.raises(ValueError, match=r"token ids \[5000\] outside \[0, 1000\)"):
        eng.generate([Request("y", (5000,), 1)])
    with pytest.raises(ValueError, match="used twice"):
        eng.generate([Request("z", (1,), 1), Request("z", (2,), 1)])


def test_kv_pool_first_fit_reuse_and_growth_keep_rows():
    pool = KVPool(layers=2)
    a, b = pool.reserve(4), pool.reserve(3)
    assert (a, b, pool.rows) == (0, 4, 8)  # grown to twice its size, or to what is needed
    dst = torch.arange(b, b + 3)
    pool.write(1, dst, torch.ones(3, 2, 4), torch.full((3, 2, 4), 2.0))
    pool.release(a)
    assert pool.reserve(2) == 0  # the freed gap, first fit
    c = pool.reserve(5)  # no gap of 5: the pool grows, rows kept where they were
    assert c == 7 and pool.rows == 16
    assert pool.k[0] is None and pool.k[1].shape == (16, 2, 4)
    assert torch.equal(pool.k[1][4:7], torch.ones(3, 2, 4))
    assert torch.equal(pool.v[1][4:7], torch.full((3, 2, 4), 2.0))


def test_kv_cache_that_outgrows_its_region_decodes_as_one_prefill(ref_model, kp, runtime_policy):
    """A cache without a capacity hint starts at its prompt's size and moves to a twice larger
    region as decode steps arrive; a second request holds the rows behind it. Every decode step's
    logits equal the prefill of the whole sequence (the bits do not depend on where keys lie)."""
    model = ReferenceModel(*ref_model, kp, runtime_policy(1))
    ids = torch.arange(3, 3 + 75) % ref_model[0].vocab_size
    grow, other = KVCache(), KVCache(capacity_hint=80)
    model.forward(torch.cat([ids[:5], ids[:70]]), [grow, other], [5, 70])
    whole = model.forward(ids[:75], [KVCache()], [75], all_logits=True)
    starts = set()
    for t in range(5, 75):
        got = model.forward(ids[t : t + 1], [grow], [1])
        starts.add(grow.start)
        assert torch.equal(got[0], whole[t]), t
    assert grow.length == 75 and grow.capacity >= 75 and len(starts) > 1  # it moved
    assert other.length == 70
