"""Hugging Face checkpoint directories: config dialects, safetensors (single or sharded), coverage.

Reads ``config.json`` as transformers 4.x writes it (``rope_theta`` / ``rope_scaling``) and as 5.x
writes it (``rope_parameters``), and ``model.safetensors`` or a sharded set with
``model.safetensors.index.json``. A checkpoint is refused unless the contract's model profile covers
it: same architecture and family features, and dims equal to one of the profile's models.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file

from .model import ModelArch

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


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be read or that the contract's profile does not cover."""


def read_hf_config(path: str | Path) -> dict:
    cfg_path = Path(path) / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(
            f"{path}: no config.json (expected a Hugging Face checkpoint directory)"
        )
    return json.loads(cfg_path.read_text())


def rope_from_hf_config(cfg: Mapping) -> tuple[float, tuple | None]:
    """``(theta, scaling)`` from either dialect; scaling is None for the default rope type, else a
    sorted tuple of (key, value) pairs including ``rope_type``."""
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping) and "rope_theta" not in params and params:
        params = next(iter(params.values()))  # per-layer-type form: all Qwen3 layers share one
    if params:
        theta = params.get("rope_theta", cfg.get("rope_theta"))
        rest = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = cfg.get("rope_theta", 10000.0)
        rest = dict(cfg.get("rope_scaling") or {})
    if "type" in rest:
        rest.setdefault("rope_type", rest.pop("type"))
    if rest.get("rope_type", "default") == "default":
        return float(theta), None
    return float(theta), tuple(sorted((k, v) for k, v in rest.items() if v is not None))


def hf_config_fields(cfg: Mapping) -> dict:
    """The profile-comparable fields of an HF config (names as the model profile spells them)."""
    heads = cfg["num_attention_heads"]
    theta, scaling = rope_from_hf_config(cfg)
    return {
        "hf_architecture": (cfg.get("architectures") or [None])[0],
        "activation": {"silu": "silu_glu"}.get(
            cfg.get("hidden_act", "silu"), cfg.get("hidden_act")
        ),
        "attention_bias": bool(cfg.get("attention_bias", False)),
        "norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"],
        "num_layers": cfg["num_hidden_layers"],
        "num_attention_heads": heads,
        "num_kv_heads": cfg.get("num_key_value_heads", heads),
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads,
        "vocab_size": cfg["vocab_size"],
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "max_position_embeddings": cfg.get("max_position_embeddings", 0),
    }


def _norm_scaling(s):
    if s is None:
        return None
    items = s.items() if isinstance(s, Mapping) else s
    return tuple(sorted((k, v) for k, v in items if v is not None))


def covered_dims(profile, fields: Mapping, where: str = "checkpoint"):
    """The profile's ``ModelDims`` equal to the checkpoint's, or a ``CheckpointError`` naming every
    difference (family-level fields first, then the closest model's dims)."""
    problems = []
    for key in ("hf_architecture", "activation", "attention_bias", "norm_eps", "rope_theta"):
        if getattr(profile, key) != fields[key]:
            problems.append(f"{key}={fields[key]!r} (profile: {getattr(profile, key)!r})")
    if _norm_scaling(profile.rope_scaling) != fields["rope_scaling"]:
        problems.append(
            f"rope_scaling={fields['rope_scaling']!r} (profile: {profile.rope_scaling!r})"
        )
    candidates = [*profile.checkpoints, profile.reference_model]
    best, best_diff = None, None
    for dims in candidates:
        diff = [
            f"{f}={fields[f]!r} ({dims.name}: {getattr(dims, f)!r})"
            for f in DIM_FIELDS
            if getattr(dims, f) != fields[f]
        ]
        if best_diff is None or len(diff) < len(best_diff):
            best, best_diff = dims, diff
    if not problems and not best_diff:
        return best
    names = ", ".join(d.name for d in candidates)
    detail = "; ".join(problems + best_diff)
    raise CheckpointError(
        f"{where}: not covered by the {profile.family} model profile ({names}): {detail}. "
        "Use a checkpoint of a covered model, or add it to the contract's model_profile."
    )


def load_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint dir: via ``model.safetensors.index.json`` when present."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors files")
    weights: dict[str, torch.Tensor] = {}
    for name in files:
        weights.update(load_file(str(path / name)))
    return weights


def load_checkpoint(path: str | Path, profile) -> tuple[ModelArch, dict[str, torch.Tensor]]:
    """``(arch, weights)`` of a covered HF checkpoint; weights keep their HF names."""
    fields = hf_config_fields(read_hf_config(path))
    dims = covered_dims(profile, fields, where=str(Path(path) / "config.json"))
    arch = ModelArch.from_profile(profile, dims)
    return arch, load_safetensors(path)


def dims_from_hf_config(cfg: Mapping, template):
    """A ``ModelDims`` (``dataclasses.replace`` of ``template``) with an HF config's dims."""
    fields = hf_config_fields(cfg)
    return dataclasses.replace(template, **{f: fields[f] for f in DIM_FIELDS})
