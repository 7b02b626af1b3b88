"""The models bench_trainer.py times, one builder each (``--models``): ``sglang`` (megatron-core
GPTModel with the contract's spec), ``stock`` (megatron-core's local spec), ``hf_sdpa``
(transformers + SDPA, the baseline) and ``fsdp`` (the fsdp trainer target's model), and
``build_case``, which pairs a model with its inputs and next-token targets."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

CONTRACT = "qwen3_dense_true_on_policy_v1"


def build_sglang(arch, dev, contract=CONTRACT):
    from contractgen.adapters.megatron.model import (
        Layout,
        build_model,
        make_config,
        padded_vocab_size,
    )
    from contractgen.adapters.megatron.policy import generated

    kp = generated().schema.kernel_policy_for(contract)
    for var in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN"):  # see build_stock
        os.environ.pop(var, None)
    config = make_config(contract, arch, Layout())
    padded = padded_vocab_size(arch, 1, kp)
    torch.manual_seed(0)
    model = build_model(config, arch, pre_process=True, post_process=True, padded_vocab_size=padded)
    return model.to(dev), padded


def build_stock(arch, dev, padded):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    # a model built before set TE's NVTE_* flags for its attention backend; TE is not used here,
    # and megatron asserts the flags match the backend, so clear them before each build
    for var in ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN"):
        os.environ.pop(var, None)
    cfg = TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.intermediate_size,
        layernorm_epsilon=arch.norm_eps,
        normalization="RMSNorm",
        qk_layernorm=arch.qk_norm,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=torch.bfloat16,
        bf16=True,
        pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=1,
        sequence_parallel=False,
        use_cpu_initialization=True,
        perform_initialization=True,
        transformer_impl="local",
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        attention_backend=AttnBackend.local,
    )
    if dev.type == "cuda":  # DotProductAttention forks megatron's CUDA RNG tracker (dropout region)
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(0)
    spec = get_gpt_layer_local_spec(qk_layernorm=arch.qk_norm, normalization="RMSNorm")
    torch.manual_seed(0)
    model = GPTModel(
        cfg,
        spec,
        vocab_size=padded,
        max_sequence_length=4096,
        pre_process=True,
        post_process=True,
        parallel_output=True,
        share_embeddings_and_output_weights=arch.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_base=int(arch.rope_theta),
    )
    return model.to(dev)


def build_hf_sdpa(arch, dev):
    """transformers ``Qwen3ForCausalLM`` with SDPA attention, bf16, as
    ``../shared/bench/hf_trainer_baseline.py`` builds it (the arch's dims, random init)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        rope_theta=arch.rope_theta,
        rms_norm_eps=arch.norm_eps,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=arch.tie_word_embeddings,
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(dev):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    return model


def build_fsdp(arch, dev, contract=CONTRACT):
    """The fsdp trainer target's model (``adapters/fsdp``): transformers' ``Qwen3ForCausalLM``
    with the contract's ops attached (``model.build``), ``fully_shard`` over a mesh of this one
    process (``model.shard``: fp32 master weights gathered in ``param_dtype`` by FSDP's
    ``MixedPrecisionPolicy``), the policy resolved as the trainer resolves it."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from contractgen.adapters.common.run_types import TrainerRun
    from contractgen.adapters.fsdp import model as fsdp_model
    from contractgen.adapters.fsdp.policy import resolve
    from contractgen.adapters.sglang.model import random_weights

    policy = resolve(contract, TrainerRun())
    alone = dist.new_group([0])  # the kernels' cross-rank reductions: a group of this rank
    mesh = init_device_mesh(dev.type, (1,), mesh_dim_names=("fsdp",))
    model = fsdp_model.build(arch, random_weights(arch, seed=0), policy, alone).to(dev)
    return fsdp_model.shard(model, policy, mesh)


class FsdpRun:
    """``time_model``'s view of the fsdp model: the packed row in (``runtime.hf_inputs``), the
    logits ``[1, T, V]`` out; loss: cross entropy summed over every position (as megatron's)."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):  # train / eval / zero_grad / parameters
        return getattr(self.model, name)

    def __call__(self, **inputs):
        return self.model(**inputs).logits

    def loss(self, logits, targets):
        return F.cross_entropy(logits.float()[0], targets[0], reduction="sum")


class HFRun:
    """``time_model``'s view of the HF model: ``model(**inputs)`` gives the logits; the loss is
    the baseline's (``hf_trainer_baseline.step``)."""

    def __init__(self, model, ids):
        self.model, self.ids = model, ids

    def __getattr__(self, name):  # train / eval / zero_grad / parameters
        return getattr(self.model, name)

    def __call__(self, input_ids):
        return self.model(input_ids=input_ids).logits

    def loss(self, logits, targets):
        v = logits.shape[-1]
        return F.cross_entropy(
            logits.float()[:, :-1].reshape(-1, v), targets[:, 1:].reshape(-1), reduction="sum"
        )


MODELS = ("sglang", "stock", "hf_sdpa", "fsdp")


def build_case(name, arch, dev, seqs, contract):
    """``(model, make_inputs, targets_fn)`` of one ``--models`` entry."""
    from contractgen.adapters.common.packing import pack_sequences
    from contractgen.adapters.megatron.model import padded_vocab_size
    from contractgen.adapters.megatron.packing import thd_params
    from contractgen.adapters.megatron.policy import generated

    ids = torch.stack(seqs)
    if name == "sglang":
        model, _ = build_sglang(arch, dev, contract)
        pack = pack_sequences([s.tolist() for s in seqs])
        params = thd_params(pack).to(dev)

        def make_inputs():
            return dict(
                input_ids=pack.token_ids[None].to(dev),
                position_ids=pack.positions[None].to(dev),
                attention_mask=None,
                packed_seq_params=params,
            )

        def targets_fn():
            t = torch.zeros_like(pack.token_ids)
            for path in pack.paths:
                t[path[:-1]] = pack.token_ids[path[1:]]
            return t[None].to(dev)

        return model, make_inputs, targets_fn
    if name == "stock":
        padded = padded_vocab_size(arch, 1, generated().schema.kernel_policy_for(contract))
        model = build_stock(arch, dev, padded)

        def make_inputs():
            pos = torch.arange(ids.shape[1])[None].expand_as(ids)
            return dict(input_ids=ids.to(dev), position_ids=pos.to(dev), attention_mask=None)

        def targets_fn():
            t = torch.zeros_like(ids)
            t[:, :-1] = ids[:, 1:]
            return t.to(dev)

        return model, make_inputs, targets_fn
    if name == "hf_sdpa":
        model = HFRun(build_hf_sdpa(arch, dev), ids)
        return model, lambda: dict(input_ids=ids.to(dev)), lambda: ids.to(dev)
    if name == "fsdp":
        from contractgen.adapters.common.packing import pack_sequences
        from contractgen.adapters.fsdp.runtime import hf_inputs

        model = FsdpRun(build_fsdp(arch, dev, contract))
        pack = pack_sequences([s.tolist() for s in seqs])  # the same token ids, packed into one row

        def targets_fn():
            t = torch.zeros_like(pack.token_ids)
            for lo, hi in zip(
                pack.offsets()[:-1].tolist(), pack.offsets()[1:].tolist(), strict=True
            ):
                t[lo : hi - 1] = pack.token_ids[lo + 1 : hi]
            return t[None].to(dev)

        return model, lambda: hf_inputs(pack, dev.type), targets_fn
    raise ValueError(f"--models: unknown model {name!r}; known: {', '.join(MODELS)}")
