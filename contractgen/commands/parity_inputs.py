"""What ``contractgen parity`` gates: the weights (the contract's reference model, a checkpoint,
a ``--model`` random checkpoint) and the LoRA adapter served on them, each refused with one line,
exit 2, before any worker starts.

Imports of torch, safetensors and the adapters stay inside the functions: they are heavy, and
``contractgen --help`` must not pay for them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ._common import fail

if TYPE_CHECKING:
    from .parity_options import ParityOptions


def _check_checkpoint(checkpoint: Path, profile) -> None:
    """Exit 2 with one line when the checkpoint's config.json is unreadable, its model is not one
    the contract's profile covers or not one it can run, or its safetensors files do not hold
    exactly that model's tensors (before any worker starts; headers only, no weights read)."""
    from ..parity.targets import rollout_adapter

    rollout = rollout_adapter()
    check_checkpoint, check_weight_files = rollout.check_checkpoint, rollout.check_weight_files
    ModelArch = rollout.ModelArch

    where = checkpoint / "config.json"
    try:
        dims = check_checkpoint(checkpoint, profile)
        check_weight_files(checkpoint, ModelArch.from_profile(profile, dims))
    except KeyError as exc:
        fail(f"error: {where}: missing key {exc.args[0]!r} (expected a Hugging Face config.json)")
    except ValueError as exc:  # CheckpointError / HFConfigError: already one line
        text = str(exc)
        fail(f"error: {text}" if text.startswith(str(checkpoint)) else f"error: {where}: {text}")


def _random_checkpoint(contract_id: str, name: str, checkpoint: Path | None, quiet: bool):
    """``--model NAME``: ``(path, its temporary folder)`` of a random-weight checkpoint of the
    profile's model ``name``. Exit 2, nothing written, for an unknown name, with --checkpoint,
    or without transformers."""
    import tempfile
    import time

    from ..adapters.launcher.layout import UnknownModelError, select_checkpoint
    from ..parity.random_model import write_random_checkpoint
    from ..parity.reference import transformers_reason

    if checkpoint is not None:
        fail("error: --model and --checkpoint cannot be combined (give one model)")
    try:
        select_checkpoint(contract_id, name)
    except UnknownModelError as exc:
        fail(f"error: {exc}")
    if why := transformers_reason():
        fail(f"error: --model writes its checkpoint with transformers: {why}")
    scratch = tempfile.TemporaryDirectory(prefix="contractgen-model-")
    t0 = time.perf_counter()
    path, n = write_random_checkpoint(contract_id, name, Path(scratch.name) / "checkpoint")
    from ..adapters.common.memory import release_free_memory

    release_free_memory()  # the model it built is gone: its heap goes back to the OS
    if not quiet:
        print(
            f"parity: wrote a random-weight {name} checkpoint ({n / 1e9:.3f} B parameters, "
            f"transformers init, seed 0) in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    return path, scratch


def load_weights(opts: ParityOptions, schema) -> tuple[object, object, bool]:
    """``(weights, scratch, serves_adapter)``: the gate's weights (a dict of tensors for the
    reference model, else a checkpoint folder) with the adapter of ``--lora`` /
    ``--lora-adapter`` added, the temporary folder of a ``--model`` checkpoint (removed at exit)
    and whether an adapter is served."""
    model, lora = opts.model, opts.lora
    contract_id, checkpoint = model.contract_id, model.checkpoint
    weights: object
    scratch = None  # the temporary folder of a --model checkpoint, removed at exit
    if model.model_name is not None:
        checkpoint, scratch = _random_checkpoint(
            contract_id, model.model_name, checkpoint, opts.output.quiet
        )
    if checkpoint is None:
        from ..parity.targets import rollout_adapter

        ModelArch, random_weights = rollout_adapter().ModelArch, rollout_adapter().random_weights
        arch = ModelArch.from_profile(schema.model_profile_for(contract_id))
        weights = random_weights(arch, seed=0)
    else:
        _check_checkpoint(checkpoint, schema.model_profile_for(contract_id))
        weights = str(checkpoint)
    if lora.lora is not None and lora.lora_adapter is not None:
        fail("error: --lora and --lora-adapter both give an adapter; pass one of them")
    if lora.lora is not None:
        weights = _with_lora(contract_id, schema, weights, lora.lora, scratch)
    if lora.lora_adapter is not None:
        weights = _with_adapter_dir(contract_id, schema, weights, lora.lora_adapter)
    return weights, scratch, lora.lora is not None or lora.lora_adapter is not None


def parse_lora(text: str) -> tuple[int, float]:
    """``RANK[,ALPHA]`` -> ``(rank, alpha)``; ALPHA defaults to 1.5 x RANK. ``ValueError`` with
    the one-line reason otherwise."""
    rank_text, _, alpha_text = text.partition(",")
    try:
        rank = int(rank_text)
        alpha = float(alpha_text) if alpha_text else 1.5 * rank
    except ValueError:
        raise ValueError(f"--lora {text!r}: expected RANK[,ALPHA], e.g. 8 or 8,16") from None
    if rank < 1:
        raise ValueError(f"--lora {text!r}: rank must be at least 1 (got {rank})")
    if not alpha > 0:
        raise ValueError(f"--lora {text!r}: alpha must be greater than 0 (got {alpha:g})")
    return rank, alpha


def _with_lora(contract_id: str, schema, weights: object, text: str, scratch: object = None):
    """The gate's weights plus a seeded random adapter within the contract's lora limits (exit
    2 with one line when the contract has none or the rank / alpha is outside them). A --model
    checkpoint (``scratch``: built here) gets it as ``CHECKPOINT_ADAPTER_FILE`` in its folder."""
    try:
        rank, alpha = parse_lora(text)
    except ValueError as exc:
        fail(f"error: {exc}")
    section = schema.CONTRACT_DATA[contract_id].get("lora")
    if section is None:
        with_lora = [c for c in schema.CONTRACT_IDS if schema.CONTRACT_DATA[c].get("lora")]
        fail(
            f"error: --lora: {contract_id} has no lora section (LoRA contracts: "
            f"{', '.join(with_lora) or 'none'})"
        )
    if rank > section["max_rank"]:
        fail(
            f"error: --lora {text!r}: rank {rank} exceeds {contract_id}'s lora.max_rank "
            f"{section['max_rank']}"
        )
    if alpha > section["max_alpha"]:
        fail(
            f"error: --lora {text!r}: alpha {alpha:g} exceeds {contract_id}'s lora.max_alpha "
            f"{section['max_alpha']:g}"
        )
    from ..adapters.common.lora import CHECKPOINT_ADAPTER_FILE, random_adapter
    from ..parity.targets import rollout_adapter

    modules = tuple(section["target_modules"])
    if isinstance(weights, dict):
        arch = rollout_adapter().ModelArch.from_profile(schema.model_profile_for(contract_id))
        return {**weights, **random_adapter(arch, modules, rank, alpha)}
    if scratch is None:
        fail(
            "error: --lora runs on the reference model or a --model NAME checkpoint (built "
            "here); a --checkpoint folder is not written into: export the adapter beside it "
            "and pass --lora-adapter on the reference model instead"
        )
    from safetensors.torch import save_file

    arch = rollout_adapter().ModelArch.from_profile(
        schema.model_profile_for(contract_id),
        rollout_adapter().check_checkpoint(weights, schema.model_profile_for(contract_id)),
    )
    adapter = random_adapter(arch, modules, rank, alpha)
    save_file(adapter, str(Path(weights) / CHECKPOINT_ADAPTER_FILE))  # the scratch checkpoint
    return weights


def _with_adapter_dir(contract_id: str, schema, weights: object, folder: Path) -> dict:
    """The gate's weights plus the PEFT adapter in ``folder`` (float32), after the checks `plan
    --lora-adapter` runs against the reference model (exit 2 with their one line)."""
    from ..adapters.families import family_for
    from ..adapters.launcher.layout import select_checkpoint
    from ..adapters.launcher.lora_adapter import (
        PEFT_PREFIX,
        WEIGHTS_FILE,
        AdapterError,
        check_adapter_dir,
    )

    if not isinstance(weights, dict):
        fail(
            "error: --lora-adapter runs on the contract's reference model (random weights); "
            "--checkpoint with --lora-adapter is not supported yet"
        )
    profile = schema.model_profile_for(contract_id)
    try:
        serving = check_adapter_dir(
            folder,
            contract_id,
            select_checkpoint(contract_id, "reference"),
            family_for(profile.family),
        )
    except AdapterError as exc:
        fail(f"error: {exc}")
    modules = tuple(sorted(schema.CONTRACT_DATA[contract_id]["lora"]["target_modules"]))
    if serving.target_modules != modules:
        fail(
            f"error: --lora-adapter {folder}: the gate serves adapters on every "
            f"lora.target_modules ({', '.join(modules)}); this one adapts "
            f"{', '.join(serving.target_modules)}"
        )
    import torch
    from safetensors.torch import load_file

    from ..adapters.common.lora import LORA_ALPHA_KEY

    adapter = {
        k.removeprefix(PEFT_PREFIX): v.float() for k, v in load_file(folder / WEIGHTS_FILE).items()
    }
    adapter[LORA_ALPHA_KEY] = torch.tensor(serving.alpha, dtype=torch.float64)
    return {**weights, **adapter}
