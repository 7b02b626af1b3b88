"""The rollout model's weights on one TP rank: Hugging Face tensors placed as this rank's shards
(column shards of q/k/v/gate/up, row shards of o/down, a vocab shard of the LM head padded to
whole 64-column GEMM tiles), a LoRA adapter's A and B, in-place updates (``load_weights_``), and
the inverse, every rank's shards gathered back to HF names (``gathered_weights``).

``RankWeights`` is the part of ``ReferenceModel`` (``model.py``) that holds tensors; the forward
numerics live there. The shard helpers are ``placement.py``'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..common.layout import padded_vocab
from ..common.lora import LORA_ALPHA_KEY, adapter_names, split_adapter
from ..common.model import ModelArch
from ..families import LAYER_PREFIX
from ..kernels._dtypes import dtype_of
from ..kernels.all_reduce import all_gather_exact
from ..kernels.lora import lora_scale, merged_weight
from ..kernels.matmul import N_TILE
from ..kernels.policy import KernelPolicy
from .placement import _parts_gather, _parts_rows, _same_values, _shard_of, _vocab_rows


@dataclass
class _Layer:
    """One decoder layer's local weights, by the family's weight roles."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    gate: torch.Tensor | None  # dense MLP (None in an MoE layer)
    up: torch.Tensor | None
    down: torch.Tensor | None
    router: torch.Tensor | None = None  # MoE block (None in a dense layer)
    expert_gate: list | None = None  # per expert, local shards
    expert_up: list | None = None
    expert_down: list | None = None
    # hybrid families: a linear-attention layer's weights (None in a full-attention layer)
    qkvz: torch.Tensor | None = None
    ba: torch.Tensor | None = None
    conv: torch.Tensor | None = None
    dt_bias: torch.Tensor | None = None
    A_log: torch.Tensor | None = None
    linear_norm: torch.Tensor | None = None
    out_proj: torch.Tensor | None = None
    # the shared expert of an MoE layer (families that have one)
    shared_gate: torch.Tensor | None = None
    shared_up: torch.Tensor | None = None
    shared_down: torch.Tensor | None = None
    shared_expert_gate: torch.Tensor | None = None


class RankWeights:
    """This rank's weights of the rollout model, by HF name and by layer role. The model sets
    ``arch``, ``kp``, ``group``, ``tp``, ``rank``, ``hl`` and ``kvl`` (local query and KV heads)
    before ``_place_weights``."""

    arch: ModelArch
    kp: KernelPolicy
    group: object
    tp: int
    rank: int
    hl: int
    kvl: int

    def _place(
        self,
        weights: dict[str, torch.Tensor],
        name: str,
        local: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """Hold ``local(weights[name])`` and remember how it was made (``load_weights_``)."""
        t = local(weights[name])
        self._loads.setdefault(name, []).append((t, local))
        return t

    def _local_sizes(self) -> dict[str, int]:
        """Local size of each sharded weight role: column shards split dim 0, row shards dim 1."""
        arch, tp, D = self.arch, self.tp, self.arch.head_dim
        hl, kvl, il = self.hl, self.kvl, arch.intermediate_size // tp
        ml = (arch.moe_intermediate_size or 0) // tp
        local = {
            "q": hl * D,
            "k": kvl * D,
            "v": kvl * D,
            "o": hl * D,
            "gate": il,
            "up": il,
            "down": il,
            **dict.fromkeys(("expert_gate", "expert_up", "expert_down"), ml),
        }
        if arch.spec.hybrid is not None and "attention_output_gate" in arch.spec.hybrid.extras:
            local["q"] = 2 * hl * D  # each head's query rows, then its gate rows
        for role, w in arch.spec.layer_weights.items():  # hybrid roles: whole key-head groups
            if role not in local and w.shard in ("column", "row"):
                local[role] = w.shape(arch)[0 if w.shard == "column" else 1] // tp
        return local

    def _place_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Hold this rank's local value of every weight (``layers``, ``embed``, ``final_norm``,
        ``lm_head``, the adapter's ``lora``) in the dense dtype (the LM head in
        ``lm_head_input_dtype``)."""
        # HF name -> the tensors it loads into, each with the function that makes its local
        # value (this rank's shard, in the held dtype) from the whole HF tensor
        self._loads: dict[str, list[tuple[torch.Tensor, Callable]]] = {}
        place = functools.partial(self._place, weights)
        arch, kp, spec = self.arch, self.kp, self.arch.spec
        dense = dtype_of(kp.dense_math_dtype)
        r, tp = self.rank, self.tp

        def rows(t, n):
            return t[r * n : (r + 1) * n].to(dense).contiguous()

        def cols(t, n):
            return t[:, r * n : (r + 1) * n].to(dense).contiguous()

        local = self._local_sizes()
        shard = {"column": rows, "row": cols}
        blocks = spec.blocks(qk_norm=arch.qk_norm, tied=arch.tie_word_embeddings)
        self.layers = []
        for i in range(arch.num_layers):
            p = LAYER_PREFIX.format(i=i)
            here = blocks | spec.layer_blocks(arch, i)
            layer = {}
            for role, w in spec.layer_weights.items():
                names = [w.hf_name.format(e=e) for e in range(arch.num_experts or 0)]
                if (w.block is not None and w.block not in here) or (
                    w.mixer is not None and w.mixer not in here
                ):
                    layer[role] = None
                    continue
                if w.parts is not None:  # concatenated parts, each split on its own
                    fn = functools.partial(_parts_rows, w.parts(arch), r, tp, dense)
                elif w.shard in shard:
                    fn = functools.partial(_shard_of, shard[w.shard], local[role])
                else:
                    fn = functools.partial(torch.Tensor.to, dtype=dense)
                if w.per_expert and w.shard in shard:
                    layer[role] = [place(p + n, fn) for n in names]
                else:
                    layer[role] = place(p + w.hf_name, fn)
            self.layers.append(_Layer(**layer))
        names = {role: w.hf_name for role, w in spec.model_weights.items()}
        self.embed = place(names["embed"], functools.partial(torch.Tensor.to, dtype=dense))
        self.final_norm = place(
            names["final_norm"], functools.partial(torch.Tensor.to, dtype=dense)
        )
        vp = padded_vocab(arch.vocab_size, tp, N_TILE)
        lm_dtype = dtype_of(kp.lm_head_input_dtype)

        def lm_rows(t: torch.Tensor) -> torch.Tensor:
            return _vocab_rows(t, r, vp // tp).to(dense).contiguous().to(lm_dtype)

        self.lm_head = place(
            names["embed"] if arch.tie_word_embeddings else names["lm_head"], lm_rows
        )
        self.lora: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        self.lora_alpha: torch.Tensor | None = None
        self.lora_scales: dict[int, torch.Tensor] = {}
        if split_adapter(weights)[1]:
            self._place_adapter(weights, place, local)

    def _place_adapter(self, weights, place: Callable, local: dict[str, int]) -> None:
        """Hold each adapted linear's A and B (pre-rounded to ``lora_adapter_dtype``; a column
        linear's B rows and a row linear's A columns of this rank), then serve them as
        ``kp.lora_serving`` says (``SERVING``)."""
        kp, r, spec = self.kp, self.rank, self.arch.spec
        if kp.lora_adapter_dtype is None:
            raise ValueError(
                "the weights carry a LoRA adapter but the contract has no LoRA numerics "
                "(kernel_policy.lora_*): use a LoRA contract"
            )
        ad = dtype_of(kp.lora_adapter_dtype)

        def whole(t: torch.Tensor) -> torch.Tensor:
            return t.to(ad).contiguous()

        def row_block(n: int) -> Callable[[torch.Tensor], torch.Tensor]:
            return lambda t: t[r * n : (r + 1) * n].to(ad).contiguous()

        def col_block(n: int) -> Callable[[torch.Tensor], torch.Tensor]:
            return lambda t: t[:, r * n : (r + 1) * n].to(ad).contiguous()

        self.lora_alpha = place(LORA_ALPHA_KEY, lambda t: t.to(torch.float64).clone())
        for i in range(self.arch.num_layers):
            for role in spec.lora_modules().values():
                w = spec.layer_weights[role]
                a_name, b_name = adapter_names(LAYER_PREFIX.format(i=i) + w.hf_name)
                if a_name not in weights:
                    continue
                if w.shard == "column":  # A whole, B's output rows split
                    a, b = place(a_name, whole), place(b_name, row_block(local[role]))
                else:  # row: A's input columns split, B whole
                    a, b = place(a_name, col_block(local[role])), place(b_name, whole)
                self.lora[(i, role)] = (a, b)
        # s = alpha / r per adapter rank, held on the device and refreshed in place when alpha is
        # loaded: the hot path reads no value on the host (a captured decode graph replays it)
        self.lora_scales = {
            rank: self._scale_value(rank).to(self.embed.device)
            for rank in sorted({a.shape[0] for a, _ in self.lora.values()})
        }
        SERVING[kp.lora_serving](self)

    def _merge_adapters(self) -> None:
        """Merged serving (``W + s·B·A`` into the base weight; no adapter path): other numerics
        than any LoRA contract's, reachable only by fault injection, to show the gate sees it."""
        for (i, role), (a, b) in self.lora.items():
            held = getattr(self.layers[i], role)
            held.copy_(merged_weight(held, a, b, self._scale(a), self.kp))
        self.lora = {}

    def _scale_value(self, rank: int) -> torch.Tensor:
        """``alpha / rank`` as the contract holds it (on the host; reads alpha's value)."""
        return lora_scale(float(self.lora_alpha), rank, self.kp)

    def _scale(self, a: torch.Tensor) -> torch.Tensor:
        return self.lora_scales[a.shape[0]]

    @torch.no_grad()
    def load_weights_(self, weights: dict[str, torch.Tensor]) -> None:
        """Take an update of some or all HF-named weights in place: each tensor's local value
        (this rank's shard, in the held dtype, made as ``_place_weights`` makes it) is ``copy_``-ed into
        the tensor the model already holds, so every address stays (captured decode graphs stay
        valid). Names the model does not hold are refused; an update of a model that shares
        memory with its caller's tensors (built without ``own``) writes into them."""
        if unknown := sorted(set(weights) - set(self._loads)):
            raise KeyError(f"{self.arch.name}: no weight named {unknown[0]!r} to load")
        dev = self.embed.device
        for name, value in weights.items():
            whole = value.to(dev, non_blocking=True)
            for held, local in self._loads[name]:
                new = local(whole)
                if new.shape != held.shape:
                    raise ValueError(
                        f"{name}: update of shape {tuple(new.shape)} for a held "
                        f"{tuple(held.shape)}"
                    )
                held.copy_(new)
        if LORA_ALPHA_KEY in weights:
            for rank, held in self.lora_scales.items():
                held.copy_(self._scale_value(rank))

    # -- weight sync -------------------------------------------------------------------------
    def gathered_weights(self) -> tuple[dict[str, torch.Tensor], list[str]]:
        """``(HF-named weights rebuilt from every rank's shards, problems)``: the inverse of
        the sharding in ``_place_weights`` (column shards concatenated on dim 0, row shards on dim 1, the
        LM head's vocab rows with the padding trimmed), in the dtype each is held in. Replicated
        tensors are gathered too: a rank whose copy differs from rank 0's is a problem. Collective
        over the TP group (every rank calls it); for weight-sync checks, not the forward."""
        spec, arch, problems = self.arch.spec, self.arch, []

        def gather(t: torch.Tensor, how: str, name: str) -> torch.Tensor:
            parts = all_gather_exact(t.contiguous(), self.group) if self.tp > 1 else [t]
            if len(parts) == 1:
                return parts[0]
            if how == "column":
                return torch.cat(parts, dim=0)
            if how == "row":
                return torch.cat(parts, dim=1)
            for r, p in enumerate(parts[1:], start=1):
                if not torch.equal(p, parts[0]):
                    problems.append(f"{name}: rank {r}'s copy differs from rank 0's")
            return parts[0]

        out: dict[str, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            p = LAYER_PREFIX.format(i=i)
            for role, w in spec.layer_weights.items():
                value = getattr(layer, role)
                if value is None:
                    continue
                if w.per_expert:  # one local shard per expert, in expert order
                    for e, shard in enumerate(value):
                        name = p + w.hf_name.format(e=e)
                        out[name] = gather(shard, w.shard, name)
                elif w.parts is not None:
                    parts = (
                        all_gather_exact(value.contiguous(), self.group) if self.tp > 1 else [value]
                    )
                    out[p + w.hf_name] = _parts_gather(w.parts(arch), parts)
                else:
                    out[p + w.hf_name] = gather(value, w.shard, p + w.hf_name)
        names = {role: w.hf_name for role, w in spec.model_weights.items()}
        out[names["embed"]] = gather(self.embed, "replicated", names["embed"])
        out[names["final_norm"]] = gather(self.final_norm, "replicated", names["final_norm"])
        for (i, role), (a, b) in self.lora.items():  # A splits like its input, B its output
            w = spec.layer_weights[role]
            a_name, b_name = adapter_names(LAYER_PREFIX.format(i=i) + w.hf_name)
            column = w.shard == "column"
            out[a_name] = gather(a, "replicated" if column else "row", a_name)
            out[b_name] = gather(b, "column" if column else "replicated", b_name)
        if self.lora_alpha is not None:
            out[LORA_ALPHA_KEY] = gather(self.lora_alpha, "replicated", LORA_ALPHA_KEY)
        head = gather(self.lm_head, "column", names["lm_head"])[: arch.vocab_size]
        if not arch.tie_word_embeddings:
            out[names["lm_head"]] = head
        elif not _same_values(head, out[names["embed"]]):
            problems.append(f"{names['lm_head']} (tied) differs from {names['embed']}")
        return out, problems


# kernel_policy.lora_serving -> what the model does with its adapters once placed
SERVING: dict[str, Callable[[RankWeights], None]] = {
    "unmerged": lambda model: None,
    "merged": RankWeights._merge_adapters,
}
