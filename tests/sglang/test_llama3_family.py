"""Llama 3 through its family module only: Hugging Face ``LlamaForCausalLM`` agreement in float32
(with and without llama3 RoPE scaling, tied and untied LM head, over more than one KV chunk), and
the contract's reference model and checkpoints read through the generated profile."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

from contractgen.adapters.common.checkpoint import (
    CheckpointError,
    dims_from_hf_config,
    hf_config_fields,
    load_checkpoint,
    read_hf_config,
)
from contractgen.adapters.sglang.engine import Request, RolloutEngine
from contractgen.adapters.sglang.model import ModelArch, ReferenceModel
from contractgen.codegen.vendored import load_target

LLAMA = "llama3_dense_true_on_policy_v1"
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # small, so the scaling changes the frequencies at the test's short positions
    "original_max_position_embeddings": 64,
}
CASES = {
    "plain_untied": dict(tie_word_embeddings=False, rope={}),
    "plain_tied": dict(tie_word_embeddings=True, rope={}),
    "llama3_scaling_tied": dict(tie_word_embeddings=True, rope=LLAMA3_SCALING),
    "llama3_scaling_untied": dict(tie_word_embeddings=False, rope=LLAMA3_SCALING),
}
SEQ_LEN = 80  # > attention_kv_chunk (64): more than one KV chunk per query


def fp32_variant(kp):
    return dataclasses.replace(
        kp, **{f.name: "float32" for f in dataclasses.fields(kp) if f.name.endswith("_dtype")}
    )


@pytest.fixture(scope="module")
def llama():
    gen = load_target("sglang")
    return SimpleNamespace(
        profile=gen.schema.model_profile_for(LLAMA),
        kp32=fp32_variant(gen.schema.kernel_policy_for(LLAMA)),
        rp=gen.runtime_policy.policy_for(LLAMA, SimpleNamespace(tp_size=1)),
    )


def _hf_llama(tmp_path, name, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    case = CASES[name]
    rope = {"rope_type": "default", **case["rope"], "rope_theta": 500000.0}
    cfg = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        initializer_range=0.1,
        tie_word_embeddings=case["tie_word_embeddings"],
        rope_parameters=rope,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norm weights
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(tmp_path / name)
    return model, tmp_path / name


def _covering(profile, path):
    """The Llama profile with the test checkpoint as its one checkpoint (dims and RoPE)."""
    cfg = read_hf_config(path)
    template = dataclasses.replace(profile.reference_model, name="tiny", tp_sizes=None)
    return dataclasses.replace(
        profile, checkpoints=(dims_from_hf_config(cfg, template, profile.family),)
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_hf_llama_agreement_float32(tmp_path, llama, name):
    hf, path = _hf_llama(tmp_path, name)
    arch, weights = load_checkpoint(path, _covering(llama.profile, path))
    assert arch.qk_norm is False and arch.tie_word_embeddings == CASES[name]["tie_word_embeddings"]
    assert (arch.rope_scaling is None) == (not CASES[name]["rope"])
    eng = RolloutEngine(ReferenceModel(arch, weights, llama.kp32, llama.rp), progress=False)
    seq = torch.randint(0, 300, (SEQ_LEN,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([seq])).logits[0]
    ours = eng.logits(seq)
    assert ours.dtype == torch.float32
    rel = (ours - ref).abs().max() / ref.abs().max()
    assert rel <= 1e-5, rel
    # greedy continuation from a prompt long enough that decode crosses a KV-chunk boundary
    prompt, cur = seq[:60], list(seq[:60])
    with torch.no_grad():
        for _ in range(8):
            cur.append(int(hf(torch.tensor([cur])).logits[0, -1].argmax()))
    got = eng.generate([Request("r", tuple(prompt), 8)])["r"]
    assert got.tokens == cur[60:]


def test_scaling_changes_the_logits(tmp_path, llama):
    """Guard the guard: the llama3 schedule is visible at the test's positions."""
    hf_plain, _ = _hf_llama(tmp_path, "plain_tied")
    hf_scaled, _ = _hf_llama(tmp_path, "llama3_scaling_tied")
    seq = torch.tensor([list(range(1, SEQ_LEN + 1))])
    with torch.no_grad():
        assert not torch.equal(hf_plain(seq).logits, hf_scaled(seq).logits)


def test_every_rope_dialect_reads_the_same(tmp_path, llama):
    _, path = _hf_llama(tmp_path, "llama3_scaling_untied")
    cfg5 = read_hf_config(path)
    f5 = hf_config_fields(cfg5, "llama3_dense")
    params = dict(cfg5.pop("rope_parameters"))
    cfg4 = dict(cfg5, rope_theta=params.pop("rope_theta"), rope_scaling=params)  # rope_type
    legacy = {("type" if k == "rope_type" else k): v for k, v in params.items()}
    cfg_old = dict(cfg5, rope_theta=cfg4["rope_theta"], rope_scaling=legacy)  # type
    for cfg in (cfg4, cfg_old):
        f = hf_config_fields(cfg, "llama3_dense")
        assert (f["rope_theta"], f["rope_scaling"]) == (f5["rope_theta"], f5["rope_scaling"])
    assert dict(f5["rope_scaling"])["type"] == "llama3"


def test_contract_checkpoints_carry_their_rope(llama):
    p = llama.profile
    by = {d.name: d for d in p.checkpoints}
    assert by["Meta-Llama-3-8B"].rope_scaling is None and by["Meta-Llama-3-8B"].rope_theta == 5e5
    for name, factor in (
        ("Llama-3.1-8B", 8.0),
        ("Llama-3.3-70B-Instruct", 8.0),
        ("Llama-3.2-1B", 32.0),
    ):
        s = dict(by[name].rope_scaling)
        assert (s["type"], s["factor"], s["original_max_position_embeddings"]) == (
            "llama3",
            factor,
            8192,
        )
    assert by["Llama-3.2-3B"].tie_word_embeddings and not by["Llama-3.1-8B"].tie_word_embeddings
    arch = ModelArch.from_profile(p)
    assert arch.family == "llama3_dense" and dict(arch.rope_scaling)["type"] == "llama3"


def test_uncovered_llama_checkpoint_is_one_line(tmp_path, llama):
    _, path = _hf_llama(tmp_path, "llama3_scaling_tied")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path, llama.profile)
    msg = str(e.value)
    assert "\n" not in msg and "not covered by the llama3_dense model profile" in msg
    assert "add-checkpoint" in msg
    cfg = read_hf_config(path)
    cfg["architectures"] = ["Qwen3ForCausalLM"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="hf_architecture='Qwen3ForCausalLM'"):
        load_checkpoint(path, _covering(llama.profile, path))
