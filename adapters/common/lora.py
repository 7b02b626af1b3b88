"""LoRA adapters as tensors: names, seeded random adapters, checks, split from base weights.

An adapter travels with (or instead of) the HF-named base weights, in one state dict: for a
target linear ``model.layers.{i}.self_attn.q_proj.weight`` its ``…q_proj.lora_A.weight``
(``[r, K]``) and ``…q_proj.lora_B.weight`` (``[N, r]``), PEFT's module-relative names, plus one
0-d float64 tensor ``LORA_ALPHA_KEY`` (alpha; the scale is alpha / r). So the rollout's in-place
weight loads, the weight-sync digest and the trainer's loader see adapters as weights, and an
adapter-only push is a state dict of these names alone. Which linears may carry one is the
family's (``lora_modules``: its dense column- and row-parallel linears); which do is the
contract's ``lora.target_modules``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..families import LAYER_PREFIX

LORA_ALPHA_KEY = "lora.alpha"
"""The adapter's alpha (a 0-d float64 tensor) in a state dict that carries an adapter."""

_A, _B = "lora_A.weight", "lora_B.weight"

CHECKPOINT_ADAPTER_FILE = "lora_adapter.safetensors"
"""An adapter carried in a checkpoint folder (the gate's names plus ``LORA_ALPHA_KEY``): both
engines read it with the base weights (``safetensors_files``), the transformers reference wraps
the model with peft for it. ``parity --model NAME --lora R`` writes one into its scratch
checkpoint."""


def adapter_names(hf_name: str) -> tuple[str, str]:
    """``…q_proj.weight`` -> (``…q_proj.lora_A.weight``, ``…q_proj.lora_B.weight``)."""
    stem = hf_name.removesuffix("weight")
    return stem + _A, stem + _B


def is_adapter_name(name: str) -> bool:
    return name == LORA_ALPHA_KEY or name.endswith((_A, _B))


@dataclass(frozen=True)
class LoraTarget:
    """One adapted linear of one layer: its role, TP split and tensor names."""

    layer: int
    role: str
    split: str  # "column" | "row"
    a_name: str
    b_name: str
    in_features: int
    out_features: int


def targets(arch, modules: tuple[str, ...]) -> list[LoraTarget]:
    """Every adapted linear of ``arch`` for the contract's ``target_modules``, layer by layer."""
    roles = arch.spec.lora_modules()
    out = []
    for i in range(arch.num_layers):
        for module in modules:
            role = roles[module]
            w = arch.spec.layer_weights[role]
            n, k = w.shape(arch)
            a, b = adapter_names(LAYER_PREFIX.format(i=i) + w.hf_name)
            out.append(LoraTarget(i, role, w.shard, a, b, k, n))
    return out


def random_adapter(
    arch, modules: tuple[str, ...], rank: int, alpha: float, seed: int = 1
) -> dict[str, torch.Tensor]:
    """Seeded float32 adapter with ``B ≠ 0`` (PEFT initialises B to zero, which would make the
    adapter path invisible): A ~ N(0, 1/K), B ~ N(0, 1/(16 r)). B's quarter-size std keeps the
    delta a fraction of the base output, as a trained adapter's is (at std 1/sqrt(r) the
    delta matched the base's size and the Llama 3 reference model's float32 agreement with
    peft grew from 3.8e-6 to 2.3e-5, past the gate's 1.5e-5)."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for t in targets(arch, modules):
        out[t.a_name] = torch.randn(rank, t.in_features, generator=g) / math.sqrt(t.in_features)
        out[t.b_name] = torch.randn(t.out_features, rank, generator=g) / (4 * math.sqrt(rank))
    out[LORA_ALPHA_KEY] = torch.tensor(float(alpha), dtype=torch.float64)
    return out


def split_adapter(
    weights: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(base weights, adapter tensors)`` of one state dict (either may be empty)."""
    base = {k: v for k, v in weights.items() if not is_adapter_name(k)}
    return base, {k: v for k, v in weights.items() if is_adapter_name(k)}


def adapter_rank(adapter: Mapping[str, torch.Tensor]) -> int:
    """r: the rows of every ``lora_A`` (``check_adapter`` has checked they agree)."""
    first = next(v for k, v in adapter.items() if k.endswith(_A))
    return int(first.shape[0])


def adapter_alpha(adapter: Mapping[str, torch.Tensor]) -> float:
    return float(adapter[LORA_ALPHA_KEY])


def check_adapter(
    arch, adapter: Mapping[str, torch.Tensor], modules: tuple[str, ...], where: str = "adapter"
) -> None:
    """Every target's A and B present with one rank and this model's shapes, alpha present,
    nothing else; a ``ValueError`` naming the first problem otherwise."""
    if LORA_ALPHA_KEY not in adapter:
        raise ValueError(f"{where}: no {LORA_ALPHA_KEY} (the adapter's alpha)")
    expected = targets(arch, modules)
    names = {LORA_ALPHA_KEY} | {n for t in expected for n in (t.a_name, t.b_name)}
    if extra := sorted(set(adapter) - names):
        raise ValueError(
            f"{where}: {extra[0]} is not an adapter of {arch.name}'s target modules "
            f"({', '.join(modules)})"
        )
    rank = None
    for t in expected:
        if t.a_name not in adapter or t.b_name not in adapter:
            missing = t.a_name if t.a_name not in adapter else t.b_name
            raise ValueError(f"{where}: missing {missing}")
        a, b = adapter[t.a_name], adapter[t.b_name]
        rank = a.shape[0] if rank is None else rank
        if tuple(a.shape) != (rank, t.in_features) or tuple(b.shape) != (t.out_features, rank):
            raise ValueError(
                f"{where}: {t.a_name} {tuple(a.shape)} / lora_B {tuple(b.shape)} do not fit "
                f"{arch.name} (expected ({rank}, {t.in_features}) and ({t.out_features}, {rank}))"
            )


PEFT_PREFIX = "base_model.model."
"""What PEFT puts before a base model's module path in an adapter's state dict."""


def peft_state_dict(adapter: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter's tensors under PEFT's saved names (``base_model.model.model.layers.0
    .self_attn.q_proj.lora_A.weight``), the names ``adapter_model.safetensors`` holds and vLLM's
    and SGLang's LoRA loaders read; alpha is not a tensor there (``adapter_config.json``)."""
    return {PEFT_PREFIX + k: v for k, v in adapter.items() if k != LORA_ALPHA_KEY}


def peft_target_modules(adapter: Mapping[str, torch.Tensor]) -> list[str]:
    """The PEFT module names (``q_proj`` …) the adapter's tensors adapt, sorted."""
    return sorted({k.split(".")[-3] for k in adapter if k.endswith(_A)})


def peft_adapter_config(adapter: Mapping[str, torch.Tensor], base_model: str) -> dict:
    """``adapter_config.json`` of the adapter: PEFT's LoRA keys (r, lora_alpha, target_modules,
    dropout 0, no bias, unmerged), ``base_model_name_or_path`` naming the base checkpoint."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": adapter_rank(adapter),
        "lora_alpha": adapter_alpha(adapter),
        "target_modules": peft_target_modules(adapter),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "inference_mode": True,
    }


def export_peft(
    adapter: Mapping[str, torch.Tensor], out, base_model: str, dtype: torch.dtype = torch.float32
) -> None:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` (PEFT's layout and key
    names) into the folder ``out``: both files built and checked in memory first, then each
    written through a temp file and ``os.replace``."""
    import json
    import os
    from pathlib import Path

    from safetensors.torch import save

    config = json.dumps(peft_adapter_config(adapter, base_model), indent=2, sort_keys=True)
    tensors = {k: v.to(dtype).contiguous() for k, v in peft_state_dict(adapter).items()}
    payload = {
        "adapter_config.json": (config + "\n").encode(),
        "adapter_model.safetensors": save(tensors),
    }
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in payload.items():
        tmp = out / f".{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, out / name)
