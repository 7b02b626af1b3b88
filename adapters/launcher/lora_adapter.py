"""A PEFT adapter folder checked against a LoRA contract and a checkpoint, and its serving flags.

``contractgen plan --lora-adapter DIR`` reads ``adapter_config.json`` and the header of
``adapter_model.safetensors`` (names, dtypes and shapes; no tensor data, no torch) and refuses,
with one line naming the field or tensor and the fix, anything the contract's ``lora`` section
and ``kernel_policy.lora_*`` fields do not admit: another base model, a target module the family
lacks or the contract does not adapt, a rank or alpha past the limits, dropout, DoRA, rsLoRA,
merged or transposed weights, biases or per-module ranks, and any tensor whose shape does not
fit the model (A: ``r x in``, B: ``out x r`` per module and layer), missing or extra.
Standard library only: the launcher runs without torch.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..families import LAYER_PREFIX, Family
from . import generated

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # what PEFT puts before the base model's module path
FLOAT_DTYPES = ("F32", "BF16", "F16")
# The SGLang LoRA backend the plan names: plain torch matmuls, x·Aᵀ then ·Bᵀ, the nearest of
# SGLang's backends to the contract's low-rank path (its bits are not compared here).
SGLANG_LORA_BACKEND = "torch_native"

# PEFT config keys whose non-default value is other numerics than the contract's unmerged
# ``base(x) + (alpha/r)·B(A(x))``: (key, the value the contract needs, what to do).
_FORBIDDEN: tuple[tuple[str, Any, str], ...] = (
    ("use_dora", False, "DoRA rescales the weight by a learned magnitude; train without DoRA"),
    (
        "use_rslora",
        False,
        "rsLoRA scales by alpha/sqrt(r), the contract by alpha/r; train without rsLoRA",
    ),
    (
        "merge_weights",
        False,
        "merged weights W + s·B·A are other numerics than the contract's unmerged serving "
        "(kernel_policy.lora_serving); export the unmerged adapter",
    ),
    (
        "fan_in_fan_out",
        False,
        "transposed (Conv1D-style) weights; export A as r x in and B as out x r",
    ),
    ("bias", "none", "LoRA biases are not part of the contract; train with bias='none'"),
)
# Keys that must be empty: each would give some modules other tensors than A and B of one rank.
_EMPTY = ("modules_to_save", "rank_pattern", "alpha_pattern", "layers_to_transform")


class AdapterError(ValueError):
    """The adapter folder does not fit the contract or the model (one line: what and the fix)."""


@dataclass(frozen=True)
class LoraServing:
    """A checked adapter and the SGLang arguments that serve it under the contract."""

    path: str
    name: str
    base_model: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    tensors: int

    @property
    def sglang_args(self) -> tuple[str, ...]:
        return (
            "--enable-lora",
            "--lora-paths",
            f"{self.name}={self.path}",
            "--max-lora-rank",
            str(self.rank),
            "--lora-target-modules",
            *self.target_modules,
            # one adapter per batch: every scored request runs the policy's adapter
            "--max-loras-per-batch",
            "1",
            "--lora-backend",
            SGLANG_LORA_BACKEND,
            # a missing or unmatched adapter tensor fails the load instead of serving the base
            "--lora-strict-loading",
        )


def safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (dtype, shape)}`` from a safetensors file's JSON header (no tensor data read)."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise AdapterError(f"{path}: not a safetensors file (shorter than its 8-byte header)")
        (size,) = struct.unpack("<Q", head)
        raw = f.read(size) if size <= 100_000_000 else b""
    try:
        header = json.loads(raw)
    except ValueError:
        raise AdapterError(f"{path}: not a safetensors file (its header is not JSON)") from None
    return {
        name: (str(entry.get("dtype")), tuple(entry.get("shape", ())))
        for name, entry in header.items()
        if name != "__metadata__" and isinstance(entry, dict)
    }


def _bad(where: str, message: str) -> AdapterError:
    return AdapterError(f"{where}: {message}")


def _number(config: Mapping[str, Any], key: str, where: str) -> float:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(where, f"{key} = {value!r}: expected a number")
    return float(value)


def _read_config(folder: Path) -> tuple[str, dict]:
    """``(where, adapter_config.json as a dict)`` of a folder that holds both PEFT files."""
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (folder / name).is_file():
            raise AdapterError(
                f"--lora-adapter {folder}: no {name} (a PEFT adapter folder holds "
                f"{CONFIG_FILE} and {WEIGHTS_FILE}; write one with export_peft or "
                "save_pretrained)"
            )
    where = str(folder / CONFIG_FILE)
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except ValueError as exc:
        raise _bad(where, f"not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise _bad(where, "expected a JSON object")
    return where, config


def _target_modules(
    config: Mapping[str, Any], where: str, family: Family, lora: Mapping[str, Any], contract_id: str
) -> list[str]:
    """The adapter's ``target_modules``, each a linear of ``family`` the contract adapts."""
    modules = config.get("target_modules")
    if isinstance(modules, str):
        modules = [modules]
    if not isinstance(modules, list) or not modules:
        raise _bad(where, f"target_modules = {modules!r}: expected a list of module names")
    roles = family.lora_modules()
    for module in modules:
        if module not in roles:
            raise _bad(
                where,
                f"target_modules: {module!r} is not a linear of {family.name} "
                f"(LoRA may target {', '.join(sorted(roles))})",
            )
        if module not in lora["target_modules"]:
            raise _bad(
                where,
                f"target_modules: {module!r} is not adapted under {contract_id} "
                f"(lora.target_modules: {', '.join(lora['target_modules'])})",
            )
    return modules


def check_adapter_dir(
    folder: str | Path, contract_id: str, dims: Any, family: Family
) -> LoraServing:
    """The checked adapter in ``folder`` for ``contract_id`` on checkpoint ``dims``, or an
    ``AdapterError`` naming the first thing that does not fit and how to fix it."""
    folder = Path(folder)
    lora = generated.schema().CONTRACT_DATA[contract_id].get("lora")
    if not lora:
        raise AdapterError(
            f"--lora-adapter: {contract_id} has no lora section; use a LoRA contract "
            "(e.g. qwen3_dense_lora_true_on_policy_v1)"
        )
    where, config = _read_config(folder)
    if config.get("peft_type", "LORA") != "LORA":
        raise _bad(where, f"peft_type = {config['peft_type']!r}: only LORA adapters are served")
    base = config.get("base_model_name_or_path")
    if not isinstance(base, str) or base.rstrip("/").rsplit("/", 1)[-1] != dims.name:
        raise _bad(
            where,
            f"base_model_name_or_path = {base!r}: the adapter must be trained on {dims.name} "
            f"(plan --model names the checkpoint; set it to {dims.name} if that is the base)",
        )
    for key, want, why in _FORBIDDEN:
        if key in config and config[key] is not None and config[key] != want:
            raise _bad(where, f"{key} = {config[key]!r}: {why}")
    for key in _EMPTY:
        if config.get(key):
            raise _bad(
                where,
                f"{key} = {config[key]!r}: the contract adapts every target module of every "
                "layer with one rank and alpha; export without it",
            )
    dropout = _number(config, "lora_dropout", where) if "lora_dropout" in config else 0.0
    if dropout > lora["dropout"]:
        raise _bad(
            where,
            f"lora_dropout = {dropout:g}: {contract_id} allows at most {lora['dropout']:g} "
            "(dropout makes the trainer's forward differ from the rollout's); set it to 0",
        )
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= lora["max_rank"]:
        raise _bad(
            where,
            f"r = {rank!r}: {contract_id} admits ranks 1..{lora['max_rank']} (lora.max_rank)",
        )
    alpha = _number(config, "lora_alpha", where)
    if not 0 < alpha <= lora["max_alpha"]:
        raise _bad(
            where,
            f"lora_alpha = {alpha:g}: {contract_id} admits 0 < lora_alpha <= "
            f"{lora['max_alpha']:g} (lora.max_alpha)",
        )
    modules = _target_modules(config, where, family, lora, contract_id)
    _check_tensors(folder / WEIGHTS_FILE, dims, family, sorted(set(modules)), rank)
    return LoraServing(
        path=str(folder.resolve()),
        name=folder.resolve().name,
        base_model=base,
        rank=rank,
        alpha=alpha,
        target_modules=tuple(sorted(set(modules))),
        tensors=2 * dims.num_layers * len(set(modules)),
    )


def _check_tensors(path: Path, dims: Any, family: Family, modules: list[str], rank: int) -> None:
    """Every module x layer has ``lora_A`` (r x in) and ``lora_B`` (out x r) in a float dtype,
    under PEFT's names, and nothing else."""
    header = safetensors_header(path)
    roles = family.lora_modules()
    expected: dict[str, tuple[int, ...]] = {}
    for i in range(dims.num_layers):
        for module in modules:
            w = family.layer_weights[roles[module]]
            out_features, in_features = w.shape(dims)
            stem = PEFT_PREFIX + LAYER_PREFIX.format(i=i) + w.hf_name.removesuffix("weight")
            expected[stem + "lora_A.weight"] = (rank, in_features)
            expected[stem + "lora_B.weight"] = (out_features, rank)
    if extra := sorted(set(header) - set(expected)):
        raise _bad(
            str(path),
            f"{extra[0]}: not an adapter tensor of the config's target_modules on "
            f"{dims.name} ({len(extra)} such tensor(s)); export only lora_A/lora_B of "
            f"{', '.join(modules)}",
        )
    for name, shape in expected.items():
        if name not in header:
            raise _bad(
                str(path),
                f"missing {name} (every layer of {dims.name} needs lora_A and lora_B for "
                f"{', '.join(modules)})",
            )
        dtype, got = header[name]
        if got != shape:
            raise _bad(
                str(path),
                f"{name}: shape {list(got)}, expected {list(shape)} for {dims.name} at r={rank} "
                "(A is r x in_features, B is out_features x r); was it trained on another "
                "model or rank?",
            )
        if dtype not in FLOAT_DTYPES:
            raise _bad(
                str(path),
                f"{name}: dtype {dtype}; export float32, bfloat16 or float16 (the rollout "
                "rounds it to kernel_policy.lora_adapter_dtype)",
            )
