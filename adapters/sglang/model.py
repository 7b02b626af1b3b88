"""Decoder (Qwen3, Llama 3, Qwen3-MoE: the family module names its weights, optional blocks and
which layers are MoE) built only from the contract kernels (the rollout's numerics).

Weights keep Hugging Face names (``model.layers.{i}.self_attn.q_proj.weight`` …, ``lm_head.weight``)
so the trainer side loads the same checkpoint. Under TP each rank holds column shards of
q/k/v/gate/up (whole heads), row shards of o/down, and a vocab shard of the LM head (padded to
whole 64-column GEMM tiles so the gathered logits equal the TP=1 ones bit for bit): ``weights.py``
places, updates and gathers them; this module is the forward.

One layer, with the casts the trainer must reproduce (h is the residual stream, ``residual_dtype``):
``x = rms_norm(h, input_layernorm).to(dense)`` → q/k/v ``invariant_matmul`` → per-head
``rms_norm(q_norm/k_norm)`` rounded, then RoPE in ``rope_dtype`` rounded → ``chunked_attention`` →
``o_proj`` partial in the accumulation dtype → tree all-reduce → ``.to(dense)`` →
``h = residual_add(attn, h)``; then ``post_attention_layernorm`` → gate/up → ``silu_glu`` →
``down_proj`` the same way → ``h = residual_add(mlp, h)`` (in a layer the family makes MoE,
``kernels.moe.moe_block`` with the same linears, then the residual add). Final:
``rms_norm(h, norm)`` → ``.to(lm_head_input_dtype)`` → LM head (``invariant_matmul``) → logits.

With a LoRA adapter in the weights (``contractgen.adapters.common.lora`` names, a LoRA contract's
``kernel_policy.lora_*``), every adapted linear's output is ``kernels.lora.lora_add(base,
lora_delta(x, A, B))``: a column linear's right after its matmul, a row linear's after its
all-reduce and before the residual add. Column shards split B's rows, row shards A's columns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from ..common.model import (
    ACTIVATIONS,
    ROPE_STYLES,
    ModelArch,
    check_weights,
    random_weights,  # noqa: F401 (the rollout's ROLE_API name)
    rotary_dim,
)
from ..kernels._dtypes import dtype_of
from ..kernels.all_reduce import all_gather_exact, world_size
from ..kernels.attention import chunked_attention
from ..kernels.linear_attention import (
    causal_conv,
    continue_delta_rule,
    decay_and_beta,
    sigmoid_gate,
    silu_gate,
)
from ..kernels.lora import lora_add, lora_delta
from ..kernels.moe import moe_block
from ..kernels.norm import rms_norm
from ..kernels.policy import KernelPolicy, kernel_policy
from ..kernels.residual import residual_add
from ..kernels.rope import rope_cos_sin
from .kv_cache import KVCache, KVPool, LinearState
from .ops import resolve_ops
from .weights import RankWeights, _Layer

MLP_BLOCKS = {"dense_mlp": "_dense_mlp", "moe": "_moe_mlp"}  # a layer's MLP block -> method


class ReferenceModel(RankWeights):
    """The rollout model on one TP rank (``group`` of size 1 or unset: the whole model)."""

    def __init__(
        self,
        arch: ModelArch,
        weights: dict[str, torch.Tensor],
        kp: KernelPolicy,
        rp,
        *,
        group=None,
        device=None,
        own: bool = False,
    ):
        """``own``: copy ``weights`` first, so no tensor the model holds shares memory with the
        caller's (a model that takes updates in place, ``load_weights_``, must own its tensors)."""
        check_weights(arch, weights)
        if device is not None or own:
            weights = {k: v.to(device, copy=own) for k, v in weights.items()}
        kp = kernel_policy(kp)  # the rollout's edge: typed from here down
        self.arch, self.kp, self.rp, self.group = arch, kp, rp, group
        self.tp = world_size(group)
        self.rank = dist.get_rank(group) if self.tp > 1 else 0
        for what, n in (
            ("num_attention_heads", arch.num_attention_heads),
            ("num_kv_heads", arch.num_kv_heads),
            ("intermediate_size", arch.intermediate_size),
            ("moe_intermediate_size", arch.moe_intermediate_size or 0),
        ):
            if n % self.tp:
                raise ValueError(f"{arch.name}: {what}={n} does not divide over TP={self.tp}")
        if arch.spec.hybrid is not None and (arch.linear_num_key_heads or 0) % self.tp:
            raise ValueError(
                f"{arch.name}: linear_num_key_heads={arch.linear_num_key_heads} does not divide "
                f"over TP={self.tp} (TP splits whole key-head groups): use a TP that divides it"
            )
        self.ops = resolve_ops(kp, rp, self.tp)
        self.act = ACTIVATIONS[arch.activation]
        self.rope = ROPE_STYLES[arch.rope_style]
        self.hl, self.kvl = arch.num_attention_heads // self.tp, arch.num_kv_heads // self.tp
        self._place_weights(weights)
        # the family says which MLP block (and, in a hybrid, which token mixer) layer i has
        spec = arch.spec
        blocks = spec.blocks(qk_norm=arch.qk_norm, tied=arch.tie_word_embeddings)
        self.mlps, self.mixers = [], []
        for i in range(arch.num_layers):
            (mlp,) = (blocks | spec.layer_blocks(arch, i)) & set(MLP_BLOCKS)
            self.mlps.append(getattr(self, MLP_BLOCKS[mlp]))
            self.mixers.append(spec.mixer(arch, i))
        self.extras = spec.hybrid.extras if spec.hybrid is not None else frozenset()

    def _column(self, i: int, role: str, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """A column-parallel linear, with its adapter when it has one."""
        y = self.ops.column_linear(x, w, self.kp)
        ab = self.lora.get((i, role))
        if ab is None:
            return y
        d = lora_delta(x, *ab, self._scale(ab[0]), self.kp, split="column", group=self.group)
        return lora_add(y, d, self.kp)

    def _row_delta(self, i: int, role: str, x: torch.Tensor) -> torch.Tensor | None:
        """A row-parallel linear's adapter output (added after its all-reduce), or None."""
        ab = self.lora.get((i, role))
        if ab is None:
            return None
        return lora_delta(x, *ab, self._scale(ab[0]), self.kp, split="row", group=self.group)

    # -- forward -----------------------------------------------------------------------------
    def _dense_mlp(self, L: _Layer, x: torch.Tensor, h: torch.Tensor, i: int) -> torch.Tensor:
        """gate/up → activation → down partial → all-reduce (→ adapter) → residual add."""
        ops, kp = self.ops, self.kp
        act = self.act(self._column(i, "gate", x, L.gate), self._column(i, "up", x, L.up), kp)
        return ops.mlp_reduce_residual(
            ops.row_partial(act, L.down, kp), h, kp, self.group,
            delta=self._row_delta(i, "down", act),
        )  # fmt: skip

    def _shared_expert(self, L: _Layer, x: torch.Tensor) -> torch.Tensor | None:
        """An MoE layer's shared expert, gated: ``sigmoid(x·w_gate) * mlp(x)`` (``gate_dtype``),
        or None where the family has none."""
        if L.shared_gate is None:
            return None
        ops, kp = self.ops, self.kp
        act = self.act(
            ops.column_linear(x, L.shared_gate, kp), ops.column_linear(x, L.shared_up, kp), kp
        )
        y = ops.mlp_all_reduce(ops.row_partial(act, L.shared_down, kp), self.group)
        y = y.to(dtype_of(kp.dense_math_dtype))
        return sigmoid_gate(y, ops.column_linear(x, L.shared_expert_gate, kp), kp)

    def _moe_mlp(self, L: _Layer, x: torch.Tensor, h: torch.Tensor, i: int) -> torch.Tensor:
        """The MoE block (``kernels.moe``) with the dense MLP's linears (and the family's shared
        expert), then the residual add."""
        ops, a = self.ops, self.arch
        y = moe_block(
            x,
            L.router,
            list(zip(L.expert_gate, L.expert_up, L.expert_down, strict=True)),
            self.kp,
            top_k=a.num_experts_per_tok,
            normalize=bool(a.norm_topk_prob),
            act=self.act,
            column_linear=ops.column_linear,
            row_partial=ops.row_partial,
            all_reduce=ops.mlp_all_reduce,
            group=self.group,
            shared_TH=self._shared_expert(L, x),
        )
        return residual_add(y, h, self.kp)

    def _pool_for(self, caches: Sequence[KVCache], lengths: Sequence[int]) -> KVPool:
        """The one pool the caches share (a new one when none has a pool yet), with room made in
        it for each cache's new rows."""
        pools = {id(c.pool): c.pool for c in caches if c.pool is not None}
        if len(pools) > 1:
            raise ValueError("the caches of one forward must share one KVPool")
        pool = next(iter(pools.values()), None) or self.new_kv_pool()
        for c, n in zip(caches, lengths, strict=True):
            c.make_room(pool, n)
        return pool

    def new_kv_pool(self) -> KVPool:
        """An empty pool for this model's layers (an engine run makes one for its requests)."""
        return KVPool(len(self.layers))

    def _qk(self, x_LHD, weight, cos, sin):
        rot = cos.shape[-1]
        if rot < x_LHD.shape[-1]:  # partial RoPE: the first ``rot`` dims rotate, the rest pass
            if weight is not None:
                x_LHD = self._norm(x_LHD, weight, self.arch.norm_eps)
            turned = self.rope(x_LHD[..., :rot].contiguous(), cos, sin, self.kp)
            return torch.cat([turned, x_LHD[..., rot:]], dim=-1)
        if weight is None:
            return self.rope(x_LHD, cos, sin, self.kp)
        if self.arch.spec.zero_centred_norm:
            return self.rope(self._norm(x_LHD, weight, self.arch.norm_eps), cos, sin, self.kp)
        return self.ops.qk_norm_rope(x_LHD, weight, self.arch.norm_eps, cos, sin, self.kp)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """The family's RMSNorm: ``weight * normalize(x)``, or for a zero-centred family
        ``(1 + weight) * normalize(x)`` with ``1 + weight`` formed in ``norm_compute_dtype``."""
        if self.arch.spec.zero_centred_norm:
            weight = 1.0 + weight.to(dtype_of(self.kp.norm_compute_dtype))
        return rms_norm(x, weight, eps, self.kp)

    def _linear_attention(
        self, i: int, L: _Layer, x: torch.Tensor, segments: Sequence[tuple]
    ) -> torch.Tensor:
        """Gated DeltaNet of layer ``i`` over packed ``x`` ``[T, hidden]`` (dense dtype):
        ``segments`` ``(lo, hi, cache, start position)`` per request, each continuing the
        request's conv and recurrent state in ``cache.linear[i]``. Returns the gated, normalised
        output ``[T, value_dim]`` (before ``out_proj``). Prefill, re-score and decode alike run
        the chunked form at absolute positions (the trainer's algorithm), a decode step its
        unfinished chunk again from the chunk's start (``continue_delta_rule``), so a sampled
        token's logprob has the re-score's bits."""
        a, kp, T = self.arch, self.kp, x.shape[0]
        Hk, Hv = a.linear_num_key_heads // self.tp, a.linear_num_value_heads // self.tp
        Dk, Dv, r = a.linear_key_head_dim, a.linear_value_head_dim, Hv // Hk
        qkvz = self.ops.column_linear(x, L.qkvz, kp).view(T, Hk, 2 * Dk + 2 * r * Dv)
        q, k, v, z = qkvz.split([Dk, Dk, r * Dv, r * Dv], dim=-1)
        b, g_in = self.ops.column_linear(x, L.ba, kp).view(T, Hk, 2 * r).split([r, r], dim=-1)
        mixed = torch.cat([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], dim=-1)
        g, beta = decay_and_beta(g_in.reshape(T, Hv), b.reshape(T, Hv), L.A_log, L.dt_bias, kp)
        w_conv = L.conv[:, 0, :]
        out = []
        for lo, hi, cache, start in segments:
            st = cache.linear.get(i)
            conv, conv_state = causal_conv(
                mixed[lo:hi], w_conv, None if st is None else st.conv, kp
            )
            cq, ck, cv = conv.split([Hk * Dk, Hk * Dk, Hv * Dv], dim=-1)
            n = hi - lo
            args = (
                cq.view(n, Hk, Dk),
                ck.view(n, Hk, Dk),
                cv.view(n, Hv, Dv),
                g[lo:hi],
                beta[lo:hi],
            )
            o, boundary, pending = continue_delta_rule(
                args, None if st is None else st.boundary_state,
                None if st is None else st.pending, start, kp,
            )  # fmt: skip
            cache.linear[i] = LinearState(conv_state, boundary, pending)
            out.append(o)
        o_THD = torch.cat(out) if out else x.new_zeros(0, Hv, Dv)
        o_THD = rms_norm(o_THD, L.linear_norm, a.norm_eps, kp)  # the plain norm, per value head
        return silu_gate(o_THD, z.reshape(T, Hv, Dv), kp).reshape(T, Hv * Dv)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        caches: Sequence[KVCache],
        lengths: Sequence[int],
        *,
        all_logits: bool = False,
        layer_outputs: list | None = None,
        hidden: bool = False,
    ) -> torch.Tensor:
        """Packed forward of ``len(caches)`` segments (``lengths[i]`` new tokens each, appended to
        ``caches[i]``). Returns logits ``[rows, vocab]`` for the last token of every segment, or for
        every token with ``all_logits``; with ``hidden``, the residual stream of every token
        ``[T, hidden]`` before the final norm (``head`` of its rows gives their logits). ``layer_outputs`` (a list) receives the residual stream
        ``[T, hidden]`` after every layer, for first-divergence reports."""
        a, kp = self.arch, self.kp
        dev = self.embed.device
        input_ids = input_ids.to(dev)
        T = input_ids.shape[0]
        starts = [c.length for c in caches]
        pool = self._pool_for(caches, lengths)
        k_starts = torch.tensor([c.start for c in caches])
        # every new row's place in the pool: request j's rows go after its cached ones
        dst = torch.cat(
            [
                torch.arange(c.start + c.length, c.start + c.length + n)
                for c, n in zip(caches, lengths, strict=True)
            ]
        ).to(dev)
        positions = torch.cat(
            [torch.arange(s, s + n, device=dev) for s, n in zip(starts, lengths, strict=True)]
        )
        cu_q = torch.tensor([0, *torch.tensor(list(lengths)).cumsum(0).tolist()])
        cu_k = torch.tensor(
            [
                0,
                *torch.tensor([s + n for s, n in zip(starts, lengths, strict=True)])
                .cumsum(0)
                .tolist(),
            ]
        )
        cos, sin = rope_cos_sin(
            positions, rotary_dim(a), a.rope_theta, a.rope_scaling, kp,
            max_position=a.max_position_embeddings,
        )  # fmt: skip

        def attend(i: int, q, k, v) -> torch.Tensor:
            k_pool, v_pool = pool.write(i, dst, k, v)
            return chunked_attention(
                q, k_pool, v_pool, positions, kp, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                k_starts=k_starts,
            )  # fmt: skip

        segments = [
            (int(lo), int(hi), c, s)
            for lo, hi, c, s in zip(cu_q[:-1], cu_q[1:], caches, starts, strict=True)
        ]

        def mix_linear(i: int, L: _Layer, x: torch.Tensor) -> torch.Tensor:
            return self._linear_attention(i, L, x, segments)

        h = self.embed[input_ids].to(dtype_of(kp.residual_dtype))
        h = self.decoder(h, cos, sin, attend, layer_outputs, mix_linear)
        for c, n in zip(caches, lengths, strict=True):
            c.length += n
        if hidden:
            return h
        rows = torch.arange(T) if all_logits else cu_q[1:] - 1
        return self.head(h[rows.to(dev)])

    def decoder(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attend: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
        layer_outputs: list | None = None,
        mix_linear: Callable[[int, _Layer, torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Every layer over the residual stream ``h`` ``[T, hidden]`` (RoPE ``cos``/``sin`` of
        its rows' positions). ``attend(layer, q, k, v)`` stores the layer's new keys and values
        and returns the attention output: the one thing the packed forward and the static decode
        step (``decode_graph``) do differently."""
        a, kp, ops, eps = self.arch, self.kp, self.ops, self.arch.norm_eps
        dense = dtype_of(kp.dense_math_dtype)
        T, D = h.shape[0], a.head_dim
        gated = "attention_output_gate" in self.extras
        for i, L in enumerate(self.layers):
            x = self._norm(h, L.input_norm, eps).to(dense)
            if self.mixers[i] == "linear_attention":
                if mix_linear is None:
                    raise ValueError(
                        f"{a.name}: layer {i} is linear attention; this path has no state"
                    )
                o = mix_linear(i, L, x)
                h = ops.attn_reduce_residual(ops.row_partial(o, L.out_proj, kp), h, kp, self.group)
                x = self._norm(h, L.post_norm, eps).to(dense)
                h = self.mlps[i](L, x, h, i)
                if layer_outputs is not None:
                    layer_outputs.append(h)
                continue
            q = self._column(i, "q", x, L.q)
            if gated:  # each head's query rows, then its output-gate rows
                q, gate = q.view(T, self.hl, 2 * D).split(D, dim=-1)
            q = self._qk(q.reshape(T, self.hl, D), L.q_norm, cos, sin)
            k = self._qk(self._column(i, "k", x, L.k).view(T, self.kvl, D), L.k_norm, cos, sin)
            v = self._column(i, "v", x, L.v).view(T, self.kvl, D)
            o = attend(i, q, k, v).reshape(T, self.hl * D).to(dense)
            if gated:
                o = sigmoid_gate(o, gate.reshape(T, self.hl * D), kp)
            h = ops.attn_reduce_residual(
                ops.row_partial(o, L.o, kp), h, kp, self.group, delta=self._row_delta(i, "o", o)
            )
            x = self._norm(h, L.post_norm, eps).to(dense)
            h = self.mlps[i](L, x, h, i)
            if layer_outputs is not None:
                layer_outputs.append(h)
        return h

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits ``[rows, vocab]`` of residual-stream rows: final norm, LM head, vocab gathered
        over TP and trimmed."""
        hf = self._norm(h, self.final_norm, self.arch.norm_eps)
        logits = self.ops.lm_head(hf, self.lm_head, self.kp)
        if self.tp > 1:
            logits = torch.cat(all_gather_exact(logits, self.group), dim=1)
        return logits[:, : self.arch.vocab_size]
