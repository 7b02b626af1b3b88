"""Loading a Hugging Face checkpoint directory: the trainer reads what the rollout reads, and the
converted megatron layout (fused QKV per query group, [gate; up], vocab padding) is right."""

from __future__ import annotations

import copy

import pytest
import torch

from contractgen.adapters.megatron.trainer import TrainerRun, trainer_logprobs_runs

V1 = "qwen3_dense_true_on_policy_v1"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    """An HF Qwen3 checkpoint with the contract's reference-model dims (random weights)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from contractgen.adapters.megatron.model import arch_for

    arch = arch_for(V1)
    cfg = Qwen3Config(
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        max_position_embeddings=arch.max_position_embeddings,
        rms_norm_eps=arch.norm_eps,
        tie_word_embeddings=arch.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": arch.rope_theta},
        initializer_range=0.05,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("ckpt") / "qwen3-tiny"
    model.save_pretrained(path)
    return model, path


def test_checkpoint_dir_exact_vs_rollout_and_close_to_hf(hf_checkpoint):
    from megatron_reference import random_sequences

    from contractgen.adapters.common.checkpoint import load_checkpoint
    from contractgen.adapters.common.policy import float32_kernel_policy
    from contractgen.adapters.megatron.policy import generated
    from contractgen.adapters.sglang.engine import RolloutEngine
    from contractgen.adapters.sglang.model import ReferenceModel
    from contractgen.codegen.vendored import load_target

    hf_model, path = hf_checkpoint
    schema = generated().schema
    arch, weights = load_checkpoint(path, schema.model_profile_for(V1))
    seqs = random_sequences((40, 11), arch.vocab_size, seed=3)
    kp = schema.kernel_policy_for(V1)
    rp = load_target("sglang").runtime_policy.policy_for(V1, None)
    engine = RolloutEngine(ReferenceModel(arch, weights, kp, rp), progress=False)
    want = [engine.rescore(s) for s in seqs]

    bf16, fp32 = trainer_logprobs_runs(
        V1, path, seqs, (1, 1, 1), [TrainerRun(), TrainerRun(dtype_override="float32")]
    )
    assert all(torch.equal(a, b) for a, b in zip(bf16.logprobs, want, strict=True))

    kp32 = float32_kernel_policy(kp)
    assert kp32.logsoftmax_dtype == "float32"
    for seq, got in zip(seqs, fp32.logprobs, strict=True):
        ids = torch.tensor(seq)
        with torch.no_grad():
            logits = hf_model(ids[None]).logits[0].float()
        ref = torch.log_softmax(logits, -1)[:-1].gather(-1, ids[1:, None])[:, 0]
        torch.testing.assert_close(got, ref, rtol=0, atol=2e-4)


def test_model_backward_matches_float64_transformers(hf_checkpoint):
    """Whole-model backward (every SGLang layer class, straight-through linears, Ulysses-free
    attention gradient, megatron's vocab-parallel cross-entropy) against float64 autograd of
    Hugging Face's Qwen3 on the same weights: loss = summed next-token cross-entropy."""
    from megatron_reference import random_sequences

    from contractgen.adapters.megatron.checkpoint import fused_qkv
    from contractgen.adapters.megatron.model import arch_for

    hf_model, path = hf_checkpoint
    arch = arch_for(V1)
    seqs = random_sequences((30, 12), arch.vocab_size, seed=4)
    (res,) = trainer_logprobs_runs(
        V1, path, seqs, (1, 1, 1), [TrainerRun(dtype_override="float32", grads=True)]
    )
    model64 = copy.deepcopy(hf_model).double()
    model64.zero_grad()
    for seq in seqs:
        ids = torch.tensor(seq)
        logits = model64(ids[None]).logits[0]
        torch.nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="sum").backward()
    hf = {n: p.grad for n, p in model64.named_parameters()}
    p0 = "model.layers.0."
    pairs = {
        "embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
        "output_layer.weight": hf["lm_head.weight"],
        "decoder.final_layernorm.weight": hf["model.norm.weight"],
        "decoder.layers.0.input_layernorm.weight": hf[p0 + "input_layernorm.weight"],
        "decoder.layers.0.pre_mlp_layernorm.weight": hf[p0 + "post_attention_layernorm.weight"],
        "decoder.layers.0.self_attention.q_layernorm.weight": hf[p0 + "self_attn.q_norm.weight"],
        "decoder.layers.0.self_attention.k_layernorm.weight": hf[p0 + "self_attn.k_norm.weight"],
        "decoder.layers.0.self_attention.linear_qkv.weight": fused_qkv(
            hf[p0 + "self_attn.q_proj.weight"],
            hf[p0 + "self_attn.k_proj.weight"],
            hf[p0 + "self_attn.v_proj.weight"],
            arch,
        ),
        "decoder.layers.0.self_attention.linear_proj.weight": hf[p0 + "self_attn.o_proj.weight"],
        "decoder.layers.0.mlp.linear_fc1.weight": torch.cat(
            [hf[p0 + "mlp.gate_proj.weight"], hf[p0 + "mlp.up_proj.weight"]]
        ),
        "decoder.layers.0.mlp.linear_fc2.weight": hf[p0 + "mlp.down_proj.weight"],
    }
    for name, want in pairs.items():
        got = res.grads[name][: want.shape[0]].double()
        assert want.abs().max() > 0, name
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * want.abs().max(), msg=name)
