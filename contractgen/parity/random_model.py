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

from ..adapters.launcher.layout import select_checkpoint
from ..codegen.vendored import load_target
from .targets import rollout_adapter, rollout_target

INITS = ("transformers", "contractgen")


def write_random_checkpoint(
    contract_id: str,
    name: str,
    out: str | Path,
    *,
    seed: int = 0,
    dtype: str = "bfloat16",
    init: str = "transformers",
) -> tuple[Path, int]:
    """Write a seeded random-weight checkpoint of the contract's model ``name`` (the launcher's
    ``--model`` names: ``select_checkpoint``, whose ``UnknownModelError`` lists the known ones)
    to ``out``; ``(out, number of parameters)``. Needs transformers."""
    import torch  # heavy

    from .reference import hf_model, reference_config  # heavy: torch

    ModelArch, random_weights = rollout_adapter().ModelArch, rollout_adapter().random_weights

    if init not in INITS:
        raise ValueError(f"init {init!r}: expected one of {', '.join(INITS)}")
    dims = select_checkpoint(contract_id, name)
    profile = load_target(rollout_target()).schema.model_profile_for(contract_id)
    arch = ModelArch.from_profile(profile, dims)
    torch_dtype = getattr(torch, dtype)
    if init == "transformers":
        import transformers  # heavy

        torch.manual_seed(seed)
        cls = getattr(transformers, profile.hf_architecture)
        model = cls(reference_config(profile, dims)).to(torch_dtype)
    else:
        model = hf_model(random_weights(arch, seed=seed), profile, torch_dtype, dims)
    out = Path(out)
    from transformers.utils import logging as hf_logging  # heavy

    hf_logging.disable_progress_bar()  # callers report the write in their own words
    try:
        model.save_pretrained(out)
    finally:
        hf_logging.enable_progress_bar()
    return out, sum(p.numel() for p in model.parameters())
