"""The model class vLLM runs for a contract (imported only inside a vLLM process).

``ContractForCausalLM`` is registered per family (``plugin.py``) and selected per run with
``LLM(..., hf_overrides={"architectures": [name], "contractgen": {...}})``: the ``contractgen``
key carries the contract's kernel policy and the model description, resolved once by the caller
(``runner.py``), so the model reads no other configuration.

What vLLM keeps: its scheduler (chunked prefill, continuous batching), its paged KV cache (one
``Attention`` layer per decoder layer, so vLLM sizes and allocates the cache and builds the
per-step metadata), its model runner and output plumbing. What the contract computes: every op
of the forward (``decoder.ContractDecoder``: kernels only, weights kept in place), the attention
itself and its K/V writes (``ContractAttentionImpl``, replacing the layer's CPU_ATTN
implementation: the K/V rows go into vLLM's paged cache at ``slot_mapping`` and are read back
through ``block_table`` for chunked prefill and decode), and the sampler (``sampler.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.attention.attention import Attention

from ..kernels.attention import chunked_attention
from ..kernels.policy import KernelPolicy
from .decoder import ContractDecoder
from .floor import ModelArch

CALLS = {"kv_write": 0, "attention": 0}
"""How many times this process's contract attention wrote K/V and attended (read by the runner)."""

CONFIG_KEY = "contractgen"
"""The ``hf_overrides`` key holding ``{"kernel_policy": {...}, "arch": {...}}``."""


def arch_from_json(d: dict) -> ModelArch:
    """``ModelArch`` from its JSON form (tuples come back as lists)."""

    def tup(v):
        return tuple(tup(x) for x in v) if isinstance(v, list) else v

    return ModelArch(**{k: tup(v) for k, v in d.items()})


def arch_to_json(arch) -> dict:
    return dataclasses.asdict(arch)


class ContractAttentionImpl:
    """The attention of one layer: the contract's ``chunked_attention`` over the keys and values
    this implementation wrote into vLLM's paged KV cache. vLLM's CPU cache tensor is
    ``[blocks, kv_heads, block_size, 2 * head_dim]``; rows ``0 .. block_size`` of its
    ``[blocks, kv_heads, 2 * block_size, head_dim]`` view hold keys, the rest values (the layout
    vLLM's CPU_ATTN reads too; only this class reads or writes it here)."""

    def __init__(self, kp: KernelPolicy, num_heads: int, num_kv_heads: int, head_size: int):
        self.kp, self.num_heads, self.num_kv_heads, self.head_size = (
            kp,
            num_heads,
            num_kv_heads,
            head_size,
        )
        self.supports_quant_query_input = False

    @staticmethod
    def _split(kv_cache: torch.Tensor):
        nb, kvh, bs, _ = kv_cache.shape
        k_cache, v_cache = kv_cache.view(nb, kvh, 2 * bs, -1).chunk(2, dim=2)
        return k_cache, v_cache, bs

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        k_cache, v_cache, bs = self._split(kv_cache)
        n = slot_mapping.shape[0]
        ok = slot_mapping >= 0  # padding slots are -1
        slots = slot_mapping[ok].long()
        blk, off = slots // bs, slots % bs
        k_cache[blk, :, off] = key[:n][ok].to(k_cache.dtype)
        v_cache[blk, :, off] = value[:n][ok].to(v_cache.dtype)
        CALLS["kv_write"] += 1

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, **_):
        if attn_metadata is None:  # vLLM's warm-up / profile run
            return output.zero_()
        md = attn_metadata
        n = md.num_actual_tokens
        k_cache, v_cache, bs = self._split(kv_cache)
        qsl = md.query_start_loc.cpu().long()
        seq_lens = md.seq_lens.cpu().long()
        R = seq_lens.shape[0]
        keys, values, positions = [], [], []
        for j in range(R):
            q_len, s = int(qsl[j + 1] - qsl[j]), int(seq_lens[j])
            pos = torch.arange(s)
            slots_blk = md.block_table[j, pos // bs].long().cpu()
            keys.append(k_cache[slots_blk, :, pos % bs])
            values.append(v_cache[slots_blk, :, pos % bs])
            positions.append(torch.arange(s - q_len, s))
        dt = query.dtype
        cu_k = torch.tensor([0, *seq_lens.cumsum(0).tolist()])
        o = chunked_attention(
            query[:n],
            torch.cat(keys).to(dt),
            torch.cat(values).to(dt),
            torch.cat(positions),
            self.kp,
            cu_seqlens_q=qsl[: R + 1],
            cu_seqlens_k=cu_k,
        )
        output[:n] = o.to(output.dtype)
        CALLS["attention"] += 1
        return output

    def process_weights_after_loading(self, act_dtype) -> None:
        return None


class ContractForCausalLM(nn.Module):
    """A decoder of a supported family computed by the contract (see the module docstring)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        hf = vllm_config.model_config.hf_config
        spec = getattr(hf, CONFIG_KEY, None)
        if not spec:
            raise ValueError(
                "contractgen vllm model: the run carries no contract; pass "
                "hf_overrides={'architectures': [...], 'contractgen': {...}} "
                "(contractgen.adapters.vllm.runner builds it)"
            )
        self.kp = KernelPolicy(**spec["kernel_policy"])
        self.arch = arch_from_json(spec["arch"])
        if vllm_config.parallel_config.tensor_parallel_size != 1:
            raise ValueError(
                "contractgen vllm model: rollout TP > 1 is not built for vLLM on CPU; "
                "run --rollout-tp 1 (the reference engine gates TP 2)"
            )
        self.decoder = ContractDecoder(self.arch, self.kp)
        a = self.arch
        cache = vllm_config.cache_config
        self.attn = nn.ModuleList(
            Attention(
                a.num_attention_heads,
                a.head_dim,
                a.head_dim**-0.5,
                a.num_kv_heads,
                cache_config=cache,
                prefix=f"{prefix}model.layers.{i}.self_attn.attn",
            )
            for i in range(a.num_layers)
        )
        for layer in self.attn:
            layer.impl = ContractAttentionImpl(
                self.kp, a.num_attention_heads, a.num_kv_heads, a.head_dim
            )
        # the strict check's self-test: vLLM's own RMSNorm as the final norm (never in a real run)
        self.plant = spec.get("plant_stock")
        if self.plant not in (None, "rms_norm"):
            raise ValueError(f"contractgen vllm model: unknown plant_stock {self.plant!r}")
        if self.plant == "rms_norm":
            from vllm.model_executor.layers.layernorm import RMSNorm  # heavy: self-test only

            self.stock_norm = RMSNorm(a.hidden_size, eps=a.norm_eps)

    # -- vLLM's model interface --------------------------------------------------------------
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.decoder.held(self.decoder.embed_name)[input_ids]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        intermediate_tensors=None,
        inputs_embeds: torch.Tensor | None = None,
        **_,
    ) -> torch.Tensor:
        if input_ids is None:
            raise ValueError("contractgen vllm model: token-id prompts only (no prompt embeds)")

        def attend(i, q, k, v):
            T = q.shape[0]
            return self.attn[i](q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1))

        return self.decoder(input_ids, positions, attend)

    def compute_logits(self, hidden_states: torch.Tensor, *_) -> torch.Tensor:
        """The contract's logits (the LM head's output dtype); the sampler takes it from here."""
        norm = getattr(self, "stock_norm", None)
        return self.decoder.logits(hidden_states, norm)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Whole HF tensors copied into the held weights in place (first load and updates)."""
        weights = list(weights)
        loaded = self.decoder.load(weights)
        if self.plant == "rms_norm":
            for name, value in weights:
                if name == self.decoder.final_norm_name:
                    self.stock_norm.weight.data.copy_(value)
                    loaded.add("stock_norm.weight")
        return loaded
