"""Model families: what an architecture is, looked up by the contract's ``family``.

One module per family (``qwen3_dense.py``, ``llama3_dense.py``, …), each defining ``FAMILY``; the
registry finds them by scanning this package, so a new family is one new module. A family says
what the forward paths and the layout rules need to know and nothing else: HF weight names and
shapes, how TP shards each weight (which linears are row-parallel), HF config keys, and its
optional blocks (QK-norm, attention bias, tied LM head, a mixture-of-experts MLP and which layers
have it).

Standard library only: ``schema/`` rules, the launcher, ``add-checkpoint`` and the torch adapters
all import this package, and ``schema/`` must stay torch-free (``tests/core/test_layering.py``).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Shard = Literal["column", "row", "vocab", "replicated"]
LAYER_PREFIX = "model.layers.{i}."


@dataclass(frozen=True)
class Weight:
    """One HF tensor: its name (per-layer names are relative to ``model.layers.{i}.``), its full
    shape as a function of the checkpoint's dims, and how TP shards it. A ``row`` weight is a
    row-parallel linear: TP splits its K (``shape[1]``), reported on the dims field ``k_field``."""

    hf_name: str
    shape: Callable[[Any], tuple[int, ...]]
    shard: Shard
    k_field: str | None = None
    block: str | None = None  # optional block it belongs to ("qk_norm", "untied_head", "moe", …)
    init: Literal["linear", "norm", "embedding", "small", "log_rate"] = "linear"  # tiny models
    after_layers: bool = False  # listed after the decoder layers (HF state-dict order)
    per_expert: bool = False  # one tensor per routed expert: ``hf_name`` holds ``{e}``
    mixer: str | None = None  # hybrid families: only in layers of this token mixer
    # a column weight whose rows are several concatenated parts, each split over TP on its own
    # (a conv over [q | k | v] channels): the parts' row counts as a function of the dims
    parts: Callable[[Any], tuple[int, ...]] | None = None


@dataclass(frozen=True)
class MoE:
    """A family's mixture-of-experts block: which decoder layers have it (the others keep the
    dense MLP) and where a checkpoint's ``config.json`` names its dims. Layer weights of the
    block carry ``block="moe"``; the dense MLP's weights carry ``block="dense_mlp"``."""

    config_keys: Mapping[str, tuple[str, ...]]  # ModelDims field -> HF keys, first present wins
    defaults: Mapping[str, Any]  # ModelDims field -> value when config.json omits it
    is_moe_layer: Callable[[Any, int], bool]  # (dims, layer index) -> MoE block or dense MLP


@dataclass(frozen=True)
class Hybrid:
    """A family whose decoder layers mix token mixers: full (softmax) attention in some layers,
    linear attention (a recurrent state instead of a KV cache) in the others. Full-attention
    weights carry ``mixer="full_attention"``, linear-attention weights ``mixer="linear_attention"``;
    ``extras`` are the family's other optional blocks (``"attention_output_gate"``,
    ``"shared_expert"``) that the forward paths build generically."""

    config_keys: Mapping[str, tuple[str, ...]]  # ModelDims field -> HF keys, first present wins
    defaults: Mapping[str, Any]  # ModelDims field -> value when config.json omits it
    is_linear_layer: Callable[[Any, int], bool]  # (dims, layer index) -> linear attention
    extras: frozenset[str] = frozenset()


MIXER_BLOCKS = ("full_attention", "linear_attention")


@dataclass(frozen=True)
class Family:
    """An architecture family (see the module docstring)."""

    name: str
    hf_architectures: tuple[str, ...]
    qk_norm: bool  # per-head RMSNorm of q and k before RoPE
    attention_bias: bool  # QKV projections carry a bias
    tied_head: bool  # checkpoints may tie the LM head to the embedding
    layer_weights: Mapping[str, Weight]  # role -> weight, inside one decoder layer
    model_weights: Mapping[str, Weight]  # role -> weight, outside the layers
    activations: Mapping[str, str]  # HF hidden_act -> model_profile.activation
    config_keys: Mapping[str, str]  # ModelDims field -> HF config.json key
    default_rms_norm_eps: float = 1e-6
    moe: MoE | None = None  # the mixture-of-experts block, for families that have one
    hybrid: Hybrid | None = None  # linear-attention layers beside full attention
    zero_centred_norm: bool = False  # RMSNorm weights stored as w - 1: (1 + w) * normalize(x)
    # config.json ``model_type``s of the family: transformers builds the model from this key, so
    # a config whose model_type names another family is another model whatever its architecture
    hf_model_types: tuple[str, ...] = ()

    def lora_modules(self) -> dict[str, str]:
        """PEFT module name (``q_proj``) -> layer-weight role, for every dense linear of a decoder
        layer (column- or row-parallel, in every layer, not per expert): what LoRA may target."""
        return {
            w.hf_name.split(".")[-2]: role
            for role, w in self.layer_weights.items()
            if w.shard in ("column", "row") and not w.per_expert and w.block is None
        }

    def blocks(self, *, qk_norm: bool, tied: bool) -> frozenset[str]:
        """The optional blocks present in one model."""
        return frozenset(b for b, on in (("qk_norm", qk_norm), ("untied_head", not tied)) if on)

    def layer_blocks(self, dims: Any, i: int) -> frozenset[str]:
        """The blocks of decoder layer ``i``: its MLP block (``{"moe"}`` where the family's MoE
        rule says so, else ``{"dense_mlp"}``), and in a hybrid family its token mixer
        (``"linear_attention"`` or ``"full_attention"``)."""
        moe = self.moe is not None and self.moe.is_moe_layer(dims, i)
        out = {"moe" if moe else "dense_mlp"}
        if self.hybrid is not None:
            out.add(self.mixer(dims, i))
        return frozenset(out)

    def mixer(self, dims: Any, i: int) -> str:
        """The token mixer of layer ``i``: ``"full_attention"`` (every layer of a non-hybrid
        family) or ``"linear_attention"``."""
        linear = self.hybrid is not None and self.hybrid.is_linear_layer(dims, i)
        return "linear_attention" if linear else "full_attention"

    def mlp_blocks(self, dims: Any) -> frozenset[str]:
        """The layer blocks (MLP blocks, and mixers of a hybrid) some layer of ``dims`` has."""
        return frozenset().union(*(self.layer_blocks(dims, i) for i in range(dims.num_layers)))

    def weight_shapes(self, dims: Any, *, qk_norm: bool) -> dict[str, tuple[int, ...]]:
        """Every HF-named tensor of a model with ``dims`` and its full (unsharded) shape."""
        return {name: w.shape(dims) for name, w in self.weights(dims, qk_norm=qk_norm).items()}

    def weights(self, dims: Any, *, qk_norm: bool) -> dict[str, Weight]:
        """Every HF tensor name of a model with ``dims`` and its ``Weight``, in a fixed order."""
        present = self.blocks(qk_norm=qk_norm, tied=dims.tie_word_embeddings)
        model = [w for w in self.model_weights.values() if w.block is None or w.block in present]
        out = {w.hf_name: w for w in model if not w.after_layers}
        for i in range(dims.num_layers):
            prefix = LAYER_PREFIX.format(i=i)
            here = present | self.layer_blocks(dims, i)
            for w in self.layer_weights.values():
                if w.block is not None and w.block not in here:
                    continue
                if w.mixer is not None and w.mixer not in here:
                    continue
                if w.per_expert:
                    for e in range(dims.num_experts):
                        out[prefix + w.hf_name.format(e=e)] = w
                else:
                    out[prefix + w.hf_name] = w
        out |= {w.hf_name: w for w in model if w.after_layers}
        return out

    def _linears(self, dims: Any) -> list[tuple[str, Weight]]:
        """``(role, weight)`` of every linear in the layer blocks a model with ``dims`` has."""
        mlp = self.mlp_blocks(dims)
        return [
            (role, w)
            for role, w in self.layer_weights.items()
            if w.init == "linear"
            and len(w.shape(dims)) == 2
            and (w.block not in ("moe", "dense_mlp") or w.block in mlp)
            and (w.mixer is None or w.mixer in mlp)
        ]

    def row_parallel(self, dims: Any) -> tuple[tuple[str, str, int], ...]:
        """``(weight role, dims field, K)`` of each row-parallel linear some layer of ``dims``
        has: the K that TP splits."""
        return tuple(
            (role, w.k_field or "", w.shape(dims)[1])
            for role, w in self._linears(dims)
            if w.shard == "row"
        )

    def matmul_ks(self, dims: Any) -> tuple[tuple[str, str, int], ...]:
        """``(weight role, dims field, K)`` of every linear some layer of ``dims`` has, and the LM
        head's (whether tied or not, the head is a matmul over the hidden size). The field is the
        weight's ``k_field``, else ``hidden_size``: the K of every column-parallel and replicated
        linear in these families."""
        head = [(role, w) for role, w in self.model_weights.items() if role == "lm_head"]
        return tuple(
            (role, w.k_field or "hidden_size", w.shape(dims)[1])
            for role, w in self._linears(dims) + head
        )


class UnknownFamilyError(KeyError, ValueError):
    """A ``family`` no module in ``contractgen.adapters.families`` defines."""

    def __str__(self) -> str:
        return (
            f"unknown model family {self.args[0]!r}; known: {', '.join(sorted(FAMILIES))} "
            "(a family is one module in adapters/families/ defining FAMILY)"
        )


def _discover() -> dict[str, Family]:
    found: dict[str, Family] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        family = getattr(importlib.import_module(f"{__name__}.{info.name}"), "FAMILY", None)
        if isinstance(family, Family):
            found[family.name] = family
    return dict(sorted(found.items()))


FAMILIES: dict[str, Family] = _discover()


def family_for(name: str) -> Family:
    """The family called ``name``; an unknown name raises ``UnknownFamilyError`` listing the known."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise UnknownFamilyError(name) from None
