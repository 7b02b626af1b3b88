"""Hugging Face checkpoint directories: config dialects, safetensors (single or sharded), coverage.

``config.json`` is read in every dialect by the family's reader (``families.hf_config``), and
``model.safetensors`` or a sharded set with ``model.safetensors.index.json``. A checkpoint is
refused unless the contract's model profile covers it: same architecture and family features, and
dims and RoPE equal to one of the profile's models.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file

from ..families import family_for
from ..families.hf_config import (
    DIM_FIELDS,
    HFConfigError,
    dim_fields,
    read_hf_config,
    rope_from_hf_config,
    scaling_key,
    unrunnable,
)
from ..families.hf_config import hf_config_fields as _family_fields
from .lora import CHECKPOINT_ADAPTER_FILE, is_adapter_name
from .model import ModelArch, weight_shapes

__all__ = [
    "DIM_FIELDS",
    "CheckpointError",
    "covered_dims",
    "dims_from_hf_config",
    "hf_config_fields",
    "load_checkpoint",
    "load_safetensors",
    "read_hf_config",
    "rope_from_hf_config",
    "safetensors_files",
]

CheckpointError = HFConfigError  # one error type for unreadable and uncovered checkpoints


def hf_config_fields(cfg: Mapping, family: str) -> dict:
    """The profile-comparable fields of an HF config, RoPE as ``rope_theta`` / ``rope_scaling``
    (the resolved ``ModelDims`` spelling)."""
    fields = _family_fields(family_for(family), cfg)
    rope = fields.pop("rope")
    fields["rope_theta"] = rope["theta"]
    fields["rope_scaling"] = scaling_key(rope["scaling"])
    return fields


def covered_dims(profile, fields: Mapping, where: str = "checkpoint"):
    """The profile's ``ModelDims`` equal to the checkpoint's (dims and RoPE), or a one-line
    ``CheckpointError`` naming every difference (family-level fields first, then the closest
    model's)."""
    problems = [
        f"{key}={fields[key]!r} (profile: {getattr(profile, key)!r})"
        for key in ("hf_architecture", "activation", "attention_bias", "norm_eps")
        if getattr(profile, key) != fields[key]
    ]
    candidates = [*profile.checkpoints, profile.reference_model]
    compared = (*dim_fields(family_for(profile.family)), "rope_theta")
    best, best_diff = None, None
    for dims in candidates:
        diff = [
            f"{f}={fields[f]!r} ({dims.name}: {getattr(dims, f)!r})"
            for f in compared
            if getattr(dims, f) != fields[f]
        ]
        if scaling_key(dims.rope_scaling) != scaling_key(fields["rope_scaling"]):
            diff.append(
                f"rope_scaling={fields['rope_scaling']!r} ({dims.name}: {dims.rope_scaling!r})"
            )
        if best_diff is None or len(diff) < len(best_diff):
            best, best_diff = dims, diff
    if not problems and not best_diff:
        return best
    names = ", ".join(d.name for d in candidates)
    detail = "; ".join(problems + best_diff)
    raise CheckpointError(
        f"{where}: not covered by the {profile.family} model profile ({names}): {detail}. "
        "Use a checkpoint of a covered model, or add it to the contract "
        "(contractgen add-checkpoint CONTRACT_ID DIR)."
    )


def check_checkpoint(path: str | Path, profile):
    """The profile's ``ModelDims`` covering the checkpoint at ``path`` (config only, no weights),
    after which nothing else in the config may change the model (``hf_config.unrunnable``)."""
    cfg = read_hf_config(path)
    where = str(Path(path) / "config.json")
    dims = covered_dims(profile, hf_config_fields(cfg, profile.family), where=where)
    family = family_for(profile.family)
    if problems := unrunnable(family, _family_fields(family, cfg)):
        raise CheckpointError(
            f"{where}: the {profile.family} profile covers its dims ({dims.name}), but "
            f"the contract cannot run it: {'; '.join(problems)}"
        )
    return dims


def safetensors_files(path: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint dir, in load order: those
    ``model.safetensors.index.json`` names when present, else every ``*.safetensors``."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
            if (path / CHECKPOINT_ADAPTER_FILE).is_file():  # an adapter beside the base weights
                files.append(CHECKPOINT_ADAPTER_FILE)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError,
                AttributeError) as exc:  # fmt: skip
            raise CheckpointError(
                f"{index}: not a safetensors index (a JSON object whose 'weight_map' maps tensor "
                f"names to files): {type(exc).__name__}: {exc}"
            ) from None
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors files")
    return [path / name for name in files]


def tensor_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's name and shape, from the safetensors headers alone (no data read); a
    missing, truncated or unreadable file is a ``CheckpointError`` naming it."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in safetensors_files(path):
        if not file.is_file():
            raise CheckpointError(f"{file}: missing (model.safetensors.index.json names it)")
        try:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():
                    shapes[name] = tuple(handle.get_slice(name).get_shape())
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{file}: not a readable safetensors file ({exc})") from None
    return shapes


# tensors a checkpoint may carry that no model weight reads (older Llama files keep RoPE's
# inverse frequencies, which the kernels compute themselves)
IGNORED_TENSORS = re.compile(r".*\.rotary_emb\.inv_freq$")


def check_weight_files(path: str | Path, arch: ModelArch) -> None:
    """The checkpoint's files hold exactly ``arch``'s tensors, each of its shape (headers only),
    before any process loads them: a missing, misshapen or extra tensor (a bias the family does
    not have; its own LM head where config.json ties it) is a ``CheckpointError``."""
    shapes = tensor_shapes(path)
    expected = weight_shapes(arch)
    head = arch.spec.model_weights["lm_head"].hf_name
    extra = sorted(
        n
        for n in set(shapes) - set(expected)
        if not IGNORED_TENSORS.match(n) and not is_adapter_name(n)  # adapters: check_adapter
    )
    if arch.tie_word_embeddings and head in extra:
        embed = arch.spec.model_weights["embed"].hf_name
        if not _same_tensor(path, head, embed):
            raise CheckpointError(
                f"{path}: config.json ties the LM head to the embedding (tie_word_embeddings), "
                f"but the files hold their own {head}, which differs from {embed}; transformers "
                "would compute with it. Set tie_word_embeddings to false (and add that model to "
                "the contract) or drop the tensor."
            )
        extra.remove(head)
    problems = []
    if missing := sorted(set(expected) - set(shapes)):
        problems.append(f"missing {len(missing)} tensor(s): {_names(missing)}")
    if bad := [f"{n} {shapes[n]} (expected {s})" for n, s in expected.items()
               if n in shapes and shapes[n] != s]:  # fmt: skip
        problems.append(f"wrong shape: {_names(bad)}")
    if extra:
        problems.append(f"{len(extra)} tensor(s) {arch.name} does not have: {_names(extra)}")
    if problems:
        raise CheckpointError(f"{path}: weights do not fit {arch.name}: " + "; ".join(problems))


def _names(items: list[str]) -> str:
    return ", ".join(items[:4]) + (f" and {len(items) - 4} more" if len(items) > 4 else "")


def _same_tensor(path: str | Path, a: str, b: str) -> bool:
    """Whether tensors ``a`` and ``b`` of the checkpoint hold the same values."""
    found: dict[str, torch.Tensor] = {}
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt") as handle:
            for name in set(handle.keys()) & {a, b}:
                found[name] = handle.get_tensor(name)
    return len(found) == 2 and torch.equal(found[a], found[b])


def load_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint dir: via ``model.safetensors.index.json`` when present."""
    weights: dict[str, torch.Tensor] = {}
    for file in safetensors_files(path):
        weights.update(load_file(str(file)))
    return weights


def load_checkpoint(path: str | Path, profile) -> tuple[ModelArch, dict[str, torch.Tensor]]:
    """``(arch, weights)`` of a covered HF checkpoint; weights keep their HF names."""
    dims = check_checkpoint(path, profile)
    arch = ModelArch.from_profile(profile, dims)
    return arch, load_safetensors(path)


def dims_from_hf_config(cfg: Mapping, template, family: str):
    """A ``ModelDims`` (``dataclasses.replace`` of ``template``) with an HF config's dims and RoPE
    (and none of the reference model's own properties: a checkpoint's router rows are its own)."""
    fields = hf_config_fields(cfg, family)
    keep = (*dim_fields(family_for(family)), "rope_theta", "rope_scaling")
    return dataclasses.replace(template, **{f: fields[f] for f in keep}, tied_router_experts=None)
