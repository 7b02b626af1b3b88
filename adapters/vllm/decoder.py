"""The contract's dense decoder (Qwen3, Llama 3) as the vLLM target computes it, free of vLLM.

Every op is the contract's kernel library (``contractgen.adapters.kernels``), composed in the order
and with the casts of the reference rollout model at TP=1 (``adapters/sglang/model.py``: its
docstring lists them): RMSNorm → ``invariant_matmul`` q/k/v → per-head QK-norm then RoPE →
attention (``attend``: the caller's KV cache) → o partial in the accumulation dtype, fixed-tree
all-reduce (one rank: itself), ``.to(dense)``, residual add → the MLP the same way with
``silu_glu`` → final RMSNorm → LM head (``invariant_matmul`` in ``lm_head_input_dtype`` over a
vocab padded to whole 64-column tiles) → logits. The logprobs (the contract's log-softmax of the
processed distribution) are the sampler's (``sampler.py``).

Weights keep Hugging Face names and are held in the contract's dtypes (the casts the reference
model makes when it places them); ``load`` takes a whole HF tensor and copies it in place, so the
engine takes new weights without a restart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from ..families import LAYER_PREFIX
from ..kernels._dtypes import dtype_of
from ..kernels.all_reduce import all_reduce_for
from ..kernels.matmul import N_TILE, invariant_matmul, shard_policy
from ..kernels.mlp import silu_glu
from ..kernels.norm import rms_norm
from ..kernels.policy import KernelPolicy, kernel_policy
from ..kernels.residual import residual_add
from ..kernels.rope import apply_rope, rope_cos_sin

# families whose every layer this decoder computes (dense MLP, full attention, no adapters)
FAMILIES = ("qwen3_dense", "llama3_dense")

# Attend = (layer index, q [T, H, D], k [T, KV, D], v [T, KV, D]) -> o [T, H, D]
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class ContractDecoder(torch.nn.Module):
    """The decoder's weights (HF names, contract dtypes) and its forward from kernels only."""

    def __init__(self, arch, kp: KernelPolicy):
        super().__init__()
        if arch.family not in FAMILIES:
            raise ValueError(
                f"vllm target: family {arch.family!r} is not built (supported: "
                f"{', '.join(FAMILIES)}); run it on the reference engine (--rollouts sglang)"
            )
        self.arch, self.kp = arch, kernel_policy(kp)
        spec = arch.spec
        dense = dtype_of(self.kp.dense_math_dtype)
        lm = dtype_of(self.kp.lm_head_input_dtype)
        self.padded_vocab = math.ceil(arch.vocab_size / N_TILE) * N_TILE
        blocks = spec.blocks(qk_norm=arch.qk_norm, tied=arch.tie_word_embeddings)
        # HF name -> (held tensor, how a whole HF tensor becomes its held value)
        self._held: dict[str, list[tuple[torch.Tensor, Callable]]] = {}
        self.layer_names: list[dict[str, str]] = []
        shapes = spec.weight_shapes(arch, qk_norm=arch.qk_norm)
        for i in range(arch.num_layers):
            p = LAYER_PREFIX.format(i=i)
            names = {}
            for role, w in spec.layer_weights.items():
                if w.block is not None and w.block not in (blocks | {"dense_mlp"}):
                    continue
                if w.mixer not in (None, "full_attention"):
                    continue
                names[role] = p + w.hf_name
                self._hold(p + w.hf_name, shapes[p + w.hf_name], dense, _cast(dense))
            self.layer_names.append(names)
        mw = {role: w.hf_name for role, w in spec.model_weights.items()}
        self.embed_name, self.final_norm_name = mw["embed"], mw["final_norm"]
        self._hold(mw["embed"], shapes[mw["embed"]], dense, _cast(dense))
        self._hold(mw["final_norm"], shapes[mw["final_norm"]], dense, _cast(dense))
        head = mw["embed"] if arch.tie_word_embeddings else mw["lm_head"]
        self.lm_head_key = "lm_head (held)"
        self._hold(
            head,
            (self.padded_vocab, arch.hidden_size),
            lm,
            lambda t: _pad_rows(t, self.padded_vocab).to(dense).to(lm),
            key=self.lm_head_key,
        )

    def _hold(self, name, shape, dtype, local, key=None) -> None:
        t = torch.zeros(tuple(shape), dtype=dtype)
        self._held.setdefault(name, []).append((t, local))
        # buffers, not parameters: vLLM's loader checks every parameter came from the checkpoint
        # by its module path, and these are loaded by HF name (``load``)
        self.register_buffer(
            "w_" + (key or name).replace(".", "_").replace(" ", "_"), t, persistent=False
        )

    def held(self, name: str) -> torch.Tensor:
        return self._held[name][0][0]

    @property
    def lm_head(self) -> torch.Tensor:
        return getattr(self, "w_" + self.lm_head_key.replace(" ", "_"))

    def names(self) -> list[str]:
        return list(self._held)

    @torch.no_grad()
    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy whole HF tensors into the held ones (in place: the engine keeps running); the
        names loaded. An unknown name or a shape that differs is refused, naming it."""
        done = set()
        for name, value in weights:
            if name not in self._held:
                raise KeyError(
                    f"vllm target: no weight named {name!r} in {self.arch.name} "
                    f"({self.arch.family}); the checkpoint is not this contract's model"
                )
            for held, local in self._held[name]:
                new = local(value.to(held.device))
                if new.shape != held.shape:
                    raise ValueError(
                        f"vllm target: {name}: shape {tuple(value.shape)} for a held "
                        f"{tuple(held.shape)}"
                    )
                held.copy_(new)
            done.add(name)
        return done

    # -- forward -----------------------------------------------------------------------------
    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.arch
        rot = int(a.head_dim * (a.partial_rotary_factor or 1.0))
        return rope_cos_sin(
            positions,
            rot,
            a.rope_theta,
            a.rope_scaling,
            self.kp,
            max_position=a.max_position_embeddings,
        )

    def _qk(self, x_THD, norm_name, cos, sin):
        kp = self.kp
        if norm_name is None:
            return apply_rope(x_THD, cos, sin, kp)
        return apply_rope(
            rms_norm(x_THD, self.held(norm_name), self.arch.norm_eps, kp), cos, sin, kp
        )

    def _row(self, x: torch.Tensor, name: str, h: torch.Tensor) -> torch.Tensor:
        """A row linear's partial in the accumulation dtype (one rank: the whole K tree), the
        contract's all-reduce, the dense dtype, the residual add."""
        kp = self.kp
        part = invariant_matmul(
            x,
            self.held(name),
            shard_policy(kp, 1),
            out_dtype=dtype_of(kp.matmul_accumulation_dtype),
        )
        reduced = all_reduce_for(kp)(part, None).to(dtype_of(kp.dense_math_dtype))
        return residual_add(reduced, h, kp)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend):
        """The residual stream ``[T, hidden]`` after every layer (before the final norm)."""
        a, kp = self.arch, self.kp
        dense = dtype_of(kp.dense_math_dtype)
        T, D = input_ids.shape[0], a.head_dim
        H, KV = a.num_attention_heads, a.num_kv_heads
        cos, sin = self.rope(positions)
        h = self.held(self.embed_name)[input_ids].to(dtype_of(kp.residual_dtype))
        eps = a.norm_eps
        for i, n in enumerate(self.layer_names):
            x = rms_norm(h, self.held(n["input_norm"]), eps, kp).to(dense)
            q = invariant_matmul(x, self.held(n["q"]), kp).reshape(T, H, D)
            k = invariant_matmul(x, self.held(n["k"]), kp).view(T, KV, D)
            v = invariant_matmul(x, self.held(n["v"]), kp).view(T, KV, D)
            q = self._qk(q, n.get("q_norm"), cos, sin)
            k = self._qk(k, n.get("k_norm"), cos, sin)
            o = attend(i, q, k, v).reshape(T, H * D).to(dense)
            h = self._row(o, n["o"], h)
            x = rms_norm(h, self.held(n["post_norm"]), eps, kp).to(dense)
            act = silu_glu(
                invariant_matmul(x, self.held(n["gate"]), kp),
                invariant_matmul(x, self.held(n["up"]), kp),
                kp,
            )
            h = self._row(act, n["down"], h)
        return h

    @torch.no_grad()
    def logits(self, h: torch.Tensor, norm: Callable | None = None) -> torch.Tensor:
        """``[rows, vocab]`` logits of residual-stream rows: final norm, LM head, vocab trimmed.
        ``norm`` replaces the final norm (a planted stock op: ``--strict``'s self-test only)."""
        kp = self.kp
        if norm is not None:
            hf = norm(h)
        else:
            hf = rms_norm(h, self.held(self.final_norm_name), self.arch.norm_eps, kp)
        lm = dtype_of(kp.lm_head_input_dtype)
        out = invariant_matmul(hf.to(lm), self.lm_head, kp)
        return out[:, : self.arch.vocab_size]


def _cast(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda t: t.to(dtype)


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] >= rows:
        return t
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])
