"""Hugging Face ``config.json`` in every dialect, read into the contract's terms (stdlib only).

transformers 4.x writes ``rope_theta`` and ``rope_scaling`` (whose kind is ``type`` in older files,
``rope_type`` in newer ones); transformers 5.x writes ``rope_parameters`` (``rope_theta`` inside,
possibly per layer type). All of them map onto the contract's checkpoint ``rope``: ``{theta,
scaling: {type, factor, …} | None}``. Used by the rollout's checkpoint reader, the trainer and
``contractgen add-checkpoint``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from . import Family

# HF rope parameter -> contract RopeScaling field (rope_type/type -> type; the rest keep names)
SCALING_KEYS = (
    "factor",
    "original_max_position_embeddings",
    "low_freq_factor",
    "high_freq_factor",
    "beta_fast",
    "beta_slow",
)
DIM_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
    "max_position_embeddings",
)


# rope scaling kinds the kernels implement (``kernels.rope.ROPE_TYPES`` less "default"; the schema's
# ``RopeScaling.type``): a test keeps the three equal
ROPE_SCALING_TYPES = ("linear", "llama3", "yarn")


def dim_fields(family: Family) -> tuple[str, ...]:
    """The checkpoint dims an HF config gives for ``family``: the dense ones, then its MoE
    block's (``num_experts`` …) when it has one, then a hybrid's linear-attention dims."""
    moe = tuple(family.moe.config_keys) if family.moe is not None else ()
    hybrid = tuple(family.hybrid.config_keys) if family.hybrid is not None else ()
    return DIM_FIELDS + moe + hybrid


class HFConfigError(ValueError):
    """A config.json that cannot be read, or that says something the family cannot run."""


def read_hf_config(path: str | Path) -> dict:
    """The parsed ``config.json`` of a checkpoint directory."""
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise HFConfigError(
            f"{path}: no config.json (expected a Hugging Face checkpoint directory)"
        )
    try:
        data = json.loads(cfg_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HFConfigError(f"{cfg_path}: not a JSON config ({exc})") from None
    if not isinstance(data, dict):
        raise HFConfigError(f"{cfg_path}: not a JSON object")
    return data


def rope_from_hf_config(cfg: Mapping) -> dict:
    """``{"theta": float, "scaling": {"type": …, …} | None}`` from any dialect."""
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping) and params and "rope_theta" not in params:
        if all(isinstance(v, Mapping) for v in params.values()):
            kinds = {json.dumps(v, sort_keys=True) for v in params.values()}
            if len(kinds) > 1:
                raise HFConfigError("rope_parameters differ between layer types; not supported")
            params = next(iter(params.values()))
    if isinstance(params, Mapping) and params:
        theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
        rest = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = cfg.get("rope_theta", 10000.0)
        rest = dict(cfg.get("rope_scaling") or {})
    kind = rest.pop("rope_type", None) or rest.pop("type", None) or "default"
    rest.pop("type", None)
    if kind == "default":
        return {"theta": float(theta), "scaling": None}
    unknown = sorted(k for k, v in rest.items() if k not in SCALING_KEYS and v is not None)
    if unknown:
        raise HFConfigError(f"rope scaling {kind!r}: parameters {unknown} are not supported")
    scaling: dict[str, Any] = {"type": kind}
    for key in SCALING_KEYS:
        if rest.get(key) is not None:
            value = rest[key]
            scaling[key] = int(value) if key == "original_max_position_embeddings" else float(value)
    return {"theta": float(theta), "scaling": scaling}


def scaling_key(scaling: Any) -> tuple | None:
    """A comparable form of a scaling (a mapping or sorted pairs, ``type`` or ``rope_type``)."""
    if scaling is None:
        return None
    items = dict(scaling.items() if isinstance(scaling, Mapping) else scaling)
    if "rope_type" in items:
        items["type"] = items.pop("rope_type")
    return tuple(sorted((k, v) for k, v in items.items() if v is not None))


def hf_config_fields(family: Family, cfg: Mapping) -> dict:
    """The profile-comparable fields of an HF config, named as the contract names them: the
    family-level ones (architecture, activation, bias, norm eps), ``rope`` and the dims."""
    keys = family.config_keys
    try:
        heads = cfg[keys["num_attention_heads"]]
        dims = {
            "hidden_size": cfg[keys["hidden_size"]],
            "intermediate_size": cfg[keys["intermediate_size"]],
            "num_layers": cfg[keys["num_layers"]],
            "num_attention_heads": heads,
            "num_kv_heads": cfg.get(keys["num_kv_heads"]) or heads,
            "head_dim": cfg.get(keys["head_dim"]) or cfg[keys["hidden_size"]] // heads,
            "vocab_size": cfg[keys["vocab_size"]],
            "tie_word_embeddings": bool(cfg.get(keys["tie_word_embeddings"], False)),
            "max_position_embeddings": cfg.get(keys["max_position_embeddings"], 0),
        }
    except KeyError as exc:
        raise HFConfigError(f"config.json has no {exc.args[0]!r}") from None
    except (TypeError, ZeroDivisionError):  # no head_dim: hidden_size // heads
        raise HFConfigError(
            f"no {keys['head_dim']}, and {keys['hidden_size']} = {cfg[keys['hidden_size']]!r} // "
            f"{keys['num_attention_heads']} = {heads!r} is not a head size: give positive integers"
        ) from None
    if family.moe is not None:
        dims |= moe_fields(family, cfg)
    if family.hybrid is not None:
        dims |= hybrid_fields(family, cfg, dims["num_layers"])
    for key, value in dims.items():  # 4.0 equals 4, but transformers refuses a float count
        if key in FRACTION_FIELDS:
            continue
        if not isinstance(value, (bool, tuple)) and not _is_int(value):
            raise HFConfigError(f"{keys.get(key, key)} = {value!r} is not an integer")
    act = cfg.get("hidden_act", "silu")
    return {
        "hf_architecture": (cfg.get("architectures") or [None])[0],
        "model_type": cfg.get("model_type"),
        "activation": family.activations.get(act, act),
        "attention_bias": bool(cfg.get("attention_bias", False)),
        "mlp_bias": bool(cfg.get("mlp_bias", False)),
        "sliding_window_layers": sliding_window_layers(cfg, dims["num_layers"]),
        "norm_eps": float(cfg.get("rms_norm_eps", family.default_rms_norm_eps)),
        "rope": rope_from_hf_config(cfg),
        **dims,
    }


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def sliding_window_layers(cfg: Mapping, num_layers: int) -> int:
    """How many layers attend through a sliding window: transformers 5's ``layer_types``, else
    (4.x dialect) ``use_sliding_window`` from layer ``max_window_layers`` on."""
    types = cfg.get("layer_types")
    if isinstance(types, list):
        return sum(t == "sliding_attention" for t in types)
    if not cfg.get("use_sliding_window") or not cfg.get("sliding_window"):
        return 0
    first = cfg.get("max_window_layers", num_layers)
    return max(0, num_layers - first) if _is_int(first) else num_layers


def unsupported(family: Family, fields: Mapping) -> list[str]:
    """What in an HF config the family cannot run (empty when it can)."""
    problems = []
    if fields["hf_architecture"] not in family.hf_architectures:
        problems.append(
            f"architecture {fields['hf_architecture']!r} is not {family.name}'s "
            f"({', '.join(family.hf_architectures)})"
        )
    if fields["activation"] not in family.activations.values():
        problems.append(f"hidden_act {fields['activation']!r} is not supported")
    return problems + unrunnable(family, fields)


def unrunnable(family: Family, fields: Mapping) -> list[str]:
    """What else in an HF config would make transformers compute another model than the
    contract's, which no profile field names (the checkpoint coverage check adds these to its
    own comparison with the profile)."""
    problems = []
    if family.hf_model_types and fields["model_type"] not in (None, *family.hf_model_types):
        problems.append(
            f"model_type {fields['model_type']!r} is not {family.name}'s "
            f"({', '.join(family.hf_model_types)}): transformers builds another model from it"
        )
    if fields["attention_bias"] and not family.attention_bias:
        problems.append(f"attention_bias=true: {family.name} has no attention bias")
    if fields["mlp_bias"]:
        problems.append(f"mlp_bias=true: {family.name}'s MLP has no bias")
    if fields["sliding_window_layers"]:
        problems.append(
            f"sliding-window attention in {fields['sliding_window_layers']} layer(s) "
            "(use_sliding_window / layer_types): the contract's attention sees every earlier token"
        )
    kind = (fields["rope"]["scaling"] or {}).get("type")
    if kind is not None and kind not in ROPE_SCALING_TYPES:
        problems.append(
            f"rope scaling {kind!r} is not supported (supported: {', '.join(ROPE_SCALING_TYPES)})"
        )
    if fields["tie_word_embeddings"] and not family.tied_head:
        problems.append(f"tie_word_embeddings=true: {family.name} has no tied head")
    if family.moe is not None and fields["num_experts_per_tok"] > fields["num_experts"]:
        problems.append(
            f"num_experts_per_tok {fields['num_experts_per_tok']} exceeds num_experts "
            f"{fields['num_experts']}"
        )
    if fields["num_attention_heads"] % fields["num_kv_heads"]:
        problems.append(
            f"num_key_value_heads {fields['num_kv_heads']} does not divide "
            f"num_attention_heads {fields['num_attention_heads']}"
        )
    return problems


FRACTION_FIELDS = ("partial_rotary_factor",)  # dims that are not counts


def hybrid_fields(family: Family, cfg: Mapping, num_layers: int) -> dict:
    """A hybrid family's linear-attention dims. transformers 5 saves ``layer_types`` (not
    ``full_attention_interval``) and ``partial_rotary_factor`` inside ``rope_parameters``: the
    interval is read back from the layer types, which must be the family's pattern for it."""
    assert family.hybrid is not None
    rope = cfg.get("rope_parameters") or {}
    out: dict[str, Any] = {}
    for field, keys in family.hybrid.config_keys.items():
        value = next((cfg[k] for k in keys if cfg.get(k) is not None), None)
        if value is None and isinstance(rope, Mapping):
            value = next((rope[k] for k in keys if rope.get(k) is not None), None)
        if value is None and field == "full_attention_interval":
            value = _interval(cfg.get("layer_types"))
        if value is None:
            if field not in family.hybrid.defaults:
                raise HFConfigError(f"config.json has no {keys[0]!r}")
            value = family.hybrid.defaults[field]
        out[field] = value
    out["partial_rotary_factor"] = float(out["partial_rotary_factor"])
    types = cfg.get("layer_types")
    if isinstance(types, list):
        dims = SimpleNamespace(num_layers=num_layers, **out)
        want = [family.mixer(dims, i) for i in range(num_layers)]
        if types != want:
            raise HFConfigError(
                f"layer_types {types} is not {family.name}'s pattern (full attention every "
                f"{out['full_attention_interval']}-th layer): the contract cannot run it"
            )
    return out


def _interval(types: Any) -> int | None:
    """The full-attention interval a ``layer_types`` list starts with (None if it has none)."""
    if isinstance(types, list) and "full_attention" in types:
        return types.index("full_attention") + 1
    return None


def moe_fields(family: Family, cfg: Mapping) -> dict:
    """The MoE dims of an HF config (``num_experts`` or transformers 5's ``num_local_experts``
    …), with the family's defaults for keys the file omits."""
    assert family.moe is not None
    out: dict[str, Any] = {}
    for field, keys in family.moe.config_keys.items():
        value = next((cfg[k] for k in keys if cfg.get(k) is not None), None)
        if value is None:
            if field not in family.moe.defaults:
                raise HFConfigError(f"config.json has no {keys[0]!r}")
            value = family.moe.defaults[field]
        out[field] = value
    out["norm_topk_prob"] = bool(out["norm_topk_prob"])
    out["mlp_only_layers"] = tuple(sorted(int(i) for i in out["mlp_only_layers"]))
    return out
