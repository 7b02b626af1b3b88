"""Random-weight checkpoints shaped like a contract's models (``parity --model NAME``).

Nothing is downloaded: the dims come from the contract's model profile (a checkpoint entry such as
``Qwen3-4B``, or the reference model), and transformers' ``save_pretrained`` writes ``config.json``
and safetensors, so the gate reads the result exactly as it reads a real checkpoint
(``--checkpoint``: the coverage check, every rank loading its own shards from disk).

Two initialisations: ``transformers`` (the architecture class's own init: normal with std
``initializer_range`` = 0.02, a near-uniform next-token distribution that sampling explores) and
``contractgen`` (the gate's reference-model initialiser: unit-variance embeddings, which at
real depth make a nearly deterministic sampler).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

INITS = ("transformers", "contractgen")


class UnknownModelName(ValueError):
    """A model name the contract's profile does not list."""


def model_names(profile: Any) -> list[str]:
    """The names ``--model`` takes: the profile's checkpoints, then its reference model."""
    return [*(d.name for d in profile.checkpoints), profile.reference_model.name]


def dims_named(profile: Any, name: str) -> Any:
    """The profile's dims entry called ``name`` (a checkpoint or the reference model)."""
    by_name = {d.name: d for d in (*profile.checkpoints, profile.reference_model)}
    if name not in by_name:
        raise UnknownModelName(
            f"--model {name!r}: not a model of the {profile.family} profile; known: "
            + ", ".join(model_names(profile))
        )
    return by_name[name]


def write_random_checkpoint(
    profile: Any, name: str, out: str | Path, *, seed: int = 0, dtype: str = "bfloat16",
    init: str = "transformers",
) -> tuple[Path, int]:  # fmt: skip
    """Write a seeded random-weight checkpoint of the profile's model ``name`` to ``out``;
    ``(out, number of parameters)``. Needs transformers."""
    import torch

    from ..adapters.sglang.model import ModelArch, random_weights
    from .reference import hf_config, hf_model

    if init not in INITS:
        raise ValueError(f"init {init!r}: expected one of {', '.join(INITS)}")
    arch = ModelArch.from_profile(profile, dims_named(profile, name))
    torch_dtype = getattr(torch, dtype)
    if init == "transformers":
        import transformers

        torch.manual_seed(seed)
        cls = getattr(transformers, profile.hf_architecture)
        model = cls(hf_config(arch, profile.hf_architecture)).to(torch_dtype)
    else:
        model = hf_model(
            random_weights(arch, seed=seed), arch, profile.hf_architecture, torch_dtype
        )
    out = Path(out)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # callers report the write in their own words
    try:
        model.save_pretrained(out)
    finally:
        hf_logging.enable_progress_bar()
    return out, sum(p.numel() for p in model.parameters())
