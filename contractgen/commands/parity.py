"""``contractgen parity``: the exact-zero gate between rollout and trainer logprobs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from ..parity.workload import WORKLOADS
from ._common import EXIT_DRIFT, EXIT_OK, fail, handle_errors, use_project_from

DEFAULT_CONTRACT = "qwen3_dense_true_on_policy_v1"
DEFAULT_LAYOUTS = "tp1,tp2,pp2,cp2"


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
    from ..adapters.memory import release_free_memory

    release_free_memory()  # the model it built is gone: its heap goes back to the OS
    if not quiet:
        print(
            f"parity: wrote a random-weight {name} checkpoint ({n / 1e9:.3f} B parameters, "
            f"transformers init, seed 0) in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr, flush=True,
        )  # fmt: skip
    return path, scratch


@click.command("parity")
@click.option(
    "--contract", "contract_id", default=DEFAULT_CONTRACT, show_default=True, help="Contract id."
)
@click.option(
    "--checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
    help="Hugging Face checkpoint directory (config.json + *.safetensors). Default: the contract's "
    "tiny reference model with seeded random weights.",
)  # fmt: skip
@click.option(
    "--model", "model_name", default=None,
    help="Build a random-weight checkpoint of this model of the contract's profile (e.g. "
    "Qwen3-4B: its real dims, transformers' own init, seeded) in a temporary folder and gate it "
    "as --checkpoint would. Needs transformers; the weights are held in memory while written.",
)  # fmt: skip
@click.option(
    "--layouts", default=None,
    help=f"Comma-separated layouts (default: {DEFAULT_LAYOUTS} and tp2pp2, and for a contract "
    "with expert parallelism ep2 and tp2ep2, each where the contract and the model allow it, tp1 "
    "always; with --inject-faults, tp4 too where allowed). epN: experts over N ranks (ep2 alone adds two attention "
    "data-parallel ranks, each scoring half the sequences).",
)  # fmt: skip
@click.option(
    "--dtype", type=click.Choice(["contract", "float32"]), default="contract", show_default=True,
    help="'float32' sets every dtype of the contract to float32: a diagnostic mode for reference "
    "checks, marked as such in the report.",
)  # fmt: skip
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the JSON report here ('-' for stdout).")  # fmt: skip
@click.option(
    "--inject-faults",
    is_flag=True,
    help="Flip every policy field on one side; each must be detected, or explained by the "
    "contract's 'unobservable' notes. A fault no layout detects gets a second chance at the "
    "first layout on the 'large' workload (when the run's own is smaller).",
)
@click.option(
    "--rollout-tps", default=None,
    help="Comma-separated rollout TP sizes, each compared with the TP=1 reference (always run). "
    "Default: every rollout TP of the contract the model can run.",
)  # fmt: skip
@click.option(
    "--workload", type=click.Choice(sorted(WORKLOADS)), default="default", show_default=True,
    help="Workload preset: 'default' (4 requests, 176-token longest prompt, 10 new tokens: 40 "
    "scored, two requests scored past two 64-position KV chunks) or 'large' (16 requests, 128-token longest prompt, 16 new tokens: 256 scored); "
    "--requests/--prompt-tokens/--new-tokens override its parts.",
)  # fmt: skip
@click.option("--requests", type=click.IntRange(min=1), default=None,
              help="Concurrent requests (default 4).")  # fmt: skip
@click.option("--prompt-tokens", type=click.IntRange(min=1), default=None,
              help="Longest prompt; the others spread below it (default 176; with "
              "--train-steps 70).")  # fmt: skip
@click.option("--new-tokens", type=click.IntRange(min=1), default=None,
              help="Tokens generated per request (default 10).")  # fmt: skip
@click.option(
    "--grads", is_flag=True,
    help="Also compare the trainer's gradient of the scored logprobs' sum with float64 autograd "
    "at every layout (every TP shard and PP stage).",
)  # fmt: skip
@click.option(
    "--no-reference", is_flag=True,
    help="Skip the float32 agreement check with Hugging Face transformers.",
)  # fmt: skip
@click.option(
    "--plant-bug", "plant_bugs", multiple=True, metavar="NAME",
    help="Self-test: plant this bug (silu_glu_sign_flip, tp_reduce_skipped) in the shared kernel library, so on BOTH sides; the gate "
    "must then FAIL (exit 1). Repeatable. attention_dk_scale_dropped changes only gradients: "
    "with --grads, or with --train-steps (its step-0 gradient check).",
)  # fmt: skip
@click.option(
    "--train-steps", type=click.IntRange(min=0), default=0, show_default=True,
    help="Run the gate over N steps of RL instead: per trainer layout, rollout (weights pushed "
    "from the trainer), a toy verifiable reward, a PPO-clip step through the trainer with "
    "megatron-core's optimizer, weights pushed back; every step's pairs must be exact and the "
    "importance ratio exactly 1. --requests counts prompts here (default 2, 4 samples each). "
    "0: the one-shot gate.",
)  # fmt: skip
@click.option(
    "--train-fault", default=None, metavar="NAME",
    help="With --train-steps: a fault for the whole run, which must make it FAIL: any "
    "--inject-faults name (one side only; the ratio leaves 1 at step 0) or sync.stale_shard "
    "(one rollout rank keeps an old shard; step 1 differs); with --lora, sync.stale_adapter "
    "(the rollout keeps step 0's adapter) or sync.no_adapter (it serves none): the adapter "
    "digest it reports differs from the pushed one.",
)  # fmt: skip
@click.option(
    "--train-lr", type=click.FloatRange(min=0, min_open=True), default=None,
    help="With --train-steps: the optimizer's learning rate (default 1e-2).",
)  # fmt: skip
@click.option(
    "--train-temperature", type=click.FloatRange(min=0, min_open=True), default=None,
    help="With --train-steps: the rollout's sampling temperature (default 1); the trainer's "
    "logprobs and loss are of the same temperature-scaled distribution.",
)  # fmt: skip
@click.option(
    "--train-microbatches", type=click.IntRange(min=1), default=None,
    help="With --train-steps: microbatches per step on each data-parallel rank (gradient "
    "accumulation in fp32; default 1). DP layouts (dp2, tp2dp2) split the step's sequences "
    "over their DP ranks first.",
)  # fmt: skip
@click.option(
    "--train-distributed-optimizer", is_flag=True,
    help="With --train-steps: shard the optimizer state over the data-parallel ranks "
    "(reduce-scatter of the gradient, AdamW on each rank's fp32 shard, all-gather), as "
    "megatron-core's distributed optimizer does, with fixed-order collectives.",
)  # fmt: skip
@click.option(
    "--no-grad-check", is_flag=True,
    help="With --train-steps: skip the step-0 gradient check (each layout's float32 gradient "
    "on the step's samples vs float64 autograd through transformers, as --grads).",
)  # fmt: skip
@click.option(
    "--strict", is_flag=True,
    help="Also fail (exit 1) when an op the contract replaces ran as the stock op on the scored "
    "path (F.linear / torch.matmul, SDPA, log_softmax, rms_norm / layer_norm outside every "
    "contract kernel, seen by a torch function mode), or when a run called no contract kernel "
    "of a kind (matmul, attention, norm, log-softmax). The report's kernel_calls says which.",
)  # fmt: skip
@click.option(
    "--trainers", default=None, metavar="NAME[,NAME]",
    help="Trainer targets to pair with the rollout, each at every layout, reported per pair. "
    "Default: every trainer target of the registry (codegen/targets.py and contractgen.toml "
    "plugins) whose generated policy has the contract.",
)  # fmt: skip
@click.option(
    "--rollouts", default=None, metavar="NAME[,NAME]",
    help="Rollout targets: sglang (the reference engine, the default) and vllm (real vLLM in "
    ".venv-vllm: tools/install-vllm.sh). Each runs the workload and is compared bitwise with the "
    "reference rollout and with every trainer at every layout (pairs name their rollout_target).",
)  # fmt: skip
@click.option(
    "--lora", "lora", default=None, metavar="RANK[,ALPHA]",
    help="A LoRA contract only: add a seeded random adapter (B != 0) of this rank on the "
    "contract's lora.target_modules, served unmerged on both sides; the transformers check "
    "runs through peft. ALPHA defaults to 1.5 x RANK (a scale that is not a power of two, so "
    "where and in which dtype it is applied shows in the bits).",
)  # fmt: skip
@click.option(
    "--lora-adapter", "lora_adapter", default=None, metavar="DIR",
    type=click.Path(path_type=Path),
    help="A LoRA contract only, instead of --lora: serve this PEFT adapter folder "
    "(adapter_config.json + adapter_model.safetensors, e.g. from export_peft) on the reference "
    "model; checked as `plan --lora-adapter` checks it (exit 2 naming the bad field or tensor).",
)  # fmt: skip
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
@click.pass_context
@handle_errors
def command(
    ctx: click.Context, contract_id: str, checkpoint: Path | None, model_name: str | None,
    layouts: str | None, dtype: str, device: str,
    json_path: Path | None, inject_faults: bool, rollout_tps: str | None, workload: str,
    requests: int | None, prompt_tokens: int | None, new_tokens: int | None, grads: bool,
    no_reference: bool, plant_bugs: tuple[str, ...], train_steps: int, train_fault: str | None,
    train_lr: float | None, strict: bool, quiet: bool, no_grad_check: bool = False,
    train_temperature: float | None = None, trainers: str | None = None, lora: str | None = None,
    lora_adapter: Path | None = None, rollouts: str | None = None,
    train_microbatches: int | None = None, train_distributed_optimizer: bool = False,
) -> None:  # fmt: skip
    """Compare rollout and trainer logprobs bitwise for every pairing of layouts.

    The TP=1 rollout (several requests, prefill + decode with a KV cache) is the reference:
    every rollout TP must sample the same tokens with the same logprobs, and the trainer
    (megatron-core module tree with the contract's layers, gloo processes on CPU) at every
    layout must score them with the same bits, for every (rollout TP, trainer layout) pair.
    Both sides are also compared with transformers' float32 forward at every layout. Exit 0
    only when all of that holds and, with --inject-faults, every fault is detected or
    explained; 1 otherwise; 2 for invalid input.

    With --train-steps N, the same comparison at every step of an RL run (see --train-steps);
    the transformers check, --grads and --inject-faults belong to the one-shot gate.
    """
    # Worker processes inherit this: megatron-core warns at import that Apex and Transformer
    # Engine are absent, which is expected here (the contract's layers replace their kernels).
    os.environ.setdefault(
        "PYTHONWARNINGS",
        "ignore:Apex is not installed:UserWarning,"
        "ignore:Transformer Engine and Apex are not installed:UserWarning",
    )
    from ..codegen.targets import UnknownTargetError
    from ..codegen.vendored import load_target
    from ..parity.gate import check_layouts, passed, run_gate, table
    from ..parity.harness import GateConfig
    from ..parity.layouts import (
        LayoutError,
        allowed_rollout_tps,
        default_layouts,
        parse_layouts,
        parse_rollout_tps,
        rollout_tp_problems,
    )
    from ..parity.rollout import arch_of
    from ..parity.targets import parse_trainers, rollout_target
    from ..parity.workload import make_workload

    use_project_from(ctx)
    schema = load_target(rollout_target()).schema
    schema.get_contract_schema(contract_id)  # unknown ids: exit 2 listing the known ones
    try:
        chosen_trainers = parse_trainers(trainers) if trainers is not None else []
    except UnknownTargetError as exc:
        fail(f"error: --trainers: {exc}")
    chosen_trainers = chosen_trainers or _default_trainers(contract_id, layouts)
    if not chosen_trainers:
        fail(f"error: {contract_id}: no trainer target's generated policy has this contract")
    if len(chosen_trainers) > 1 and train_steps:
        fail(
            f"error: --train-steps runs one trainer target at a time (got --trainers "
            f"{','.join(chosen_trainers)}); give --trainers NAME"
        )
    _check_blocks(contract_id, schema.model_profile_for(contract_id), chosen_trainers)
    if lora is not None:
        _check_lora_trainers(chosen_trainers)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            fail("error: --device cuda: no CUDA device is available here")
    weights: object
    scratch = None  # the temporary folder of a --model checkpoint, removed at exit
    if model_name is not None:
        checkpoint, scratch = _random_checkpoint(contract_id, model_name, checkpoint, quiet)
    if checkpoint is None:
        from ..parity.targets import rollout_adapter

        ModelArch, random_weights = rollout_adapter().ModelArch, rollout_adapter().random_weights
        arch = ModelArch.from_profile(schema.model_profile_for(contract_id))
        weights = random_weights(arch, seed=0)
    else:
        _check_checkpoint(checkpoint, schema.model_profile_for(contract_id))
        weights = str(checkpoint)
    if lora is not None and lora_adapter is not None:
        fail("error: --lora and --lora-adapter both give an adapter; pass one of them")
    if lora is not None:
        weights = _with_lora(contract_id, schema, weights, lora, scratch)
    if lora_adapter is not None:
        weights = _with_adapter_dir(contract_id, schema, weights, lora_adapter)
        lora = "adapter"  # an adapter is served from here on, as with --lora
    from ..adapters.kernels.planted import BACKWARD_BUGS, BUGS

    if unknown := sorted(set(plant_bugs) - set(BUGS) - set(BACKWARD_BUGS)):
        known = ", ".join(sorted({*BUGS, *BACKWARD_BUGS}))
        fail(f"error: --plant-bug {unknown[0]!r}: unknown; known: {known}")
    grad_checked = (not no_grad_check) if train_steps else grads
    if not grad_checked and (backward := sorted(set(plant_bugs) & set(BACKWARD_BUGS))):
        fail(
            f"error: --plant-bug {backward[0]}: a gradient-only bug, which only a gradient "
            "check can catch; add --grads, or with --train-steps drop --no-grad-check"
        )
    if train_steps:
        given = [
            flag for flag, on in (("--inject-faults", inject_faults), ("--grads", grads),
                                  ("--strict", strict)) if on
        ]  # fmt: skip
        if given:
            fail(f"error: {given[0]} cannot be combined with --train-steps (use --train-fault)")
    elif (train_fault is not None or train_lr is not None or no_grad_check or train_temperature
          or train_microbatches is not None or train_distributed_optimizer):  # fmt: skip
        fail(
            "error: --train-fault, --train-lr, --train-temperature, --train-microbatches, "
            "--train-distributed-optimizer and --no-grad-check need --train-steps N (N >= 1)"
        )
    preset = WORKLOADS[workload]
    sizes = (requests or preset[0], prompt_tokens or preset[1], new_tokens or preset[2])
    arch = arch_of(contract_id, weights)
    if sizes[1] + sizes[2] > arch.max_position_embeddings:
        fail(
            f"error: --prompt-tokens {sizes[1]} + --new-tokens {sizes[2]} exceeds "
            f"max_position_embeddings={arch.max_position_embeddings} of {arch.name}"
        )
    try:
        if layouts is None:
            chosen, left_out = default_layouts(
                contract_id, arch.name, DEFAULT_LAYOUTS, train_steps=bool(train_steps),
                inject_faults=inject_faults,
            )  # fmt: skip
            for why in [] if quiet else left_out:
                click.echo(f"parity: default layout left out: {why}", err=True)
        else:
            chosen = parse_layouts(layouts)
            if train_steps and (ep := [lay.name for lay in chosen if lay.ep > 1]):
                raise LayoutError(
                    f"--layouts {', '.join(ep)}: expert parallelism runs the forward only (the "
                    "token exchange has no backward yet); --train-steps needs EP 1 layouts"
                )
        chosen, chosen_trainers = _layouts_per_trainer(
            chosen, chosen_trainers, layouts is None, explicit=trainers is not None
        )
        gpus = _cuda_device_count() if device == "cuda" else None
        if gpus is not None:
            chosen = _fit_gpus(chosen, gpus, given=layouts is not None)
        if rollout_tps is None:
            tps = allowed_rollout_tps(contract_id, arch.name)
            if gpus is not None:  # one GPU per rank: the default stops at the GPUs there are
                tps = [tp for tp in tps if tp <= gpus]
        else:
            tps = parse_rollout_tps(rollout_tps)
            problems = [p for tp in tps for p in rollout_tp_problems(contract_id, tp, arch.name)]
            if gpus is not None:
                problems += [
                    f"rollout TP={tp} needs {tp} CUDA devices; {gpus} visible"
                    for tp in tps
                    if tp > gpus
                ]
            if problems:
                raise LayoutError("invalid --rollout-tps:\n  " + "\n  ".join(problems))
        config = GateConfig(
            contract_id, weights, chosen, None if dtype == "contract" else dtype, device,
            inject_faults, not quiet, rollout_tps=tps, workload=make_workload(*sizes),
            hf_reference=not no_reference, grads=grads, planted_bugs=tuple(plant_bugs),
            strict=strict, trainers=tuple(chosen_trainers),
            rollouts=_rollouts(rollouts, arch, lora, train_steps, inject_faults),
        )  # fmt: skip
        check_layouts(config)
    except LayoutError as exc:
        fail(f"error: {exc}")
    if train_steps:
        own = prompt_tokens is None and workload == "default"  # the RL loop's own prompt length
        config = _training_config(config, train_steps, train_fault, train_lr, requests, sizes, own)
        import dataclasses

        training = dataclasses.replace(config.training, grad_check=not no_grad_check)
        if train_temperature is not None:
            training = dataclasses.replace(training, temperature=train_temperature)
        if train_microbatches is not None:
            training = dataclasses.replace(training, microbatches=train_microbatches)
        if train_distributed_optimizer:
            training = dataclasses.replace(training, distributed_optimizer=True)
        from ..parity.training import ADAPTER_FAULTS, DP_DESYNC

        if train_fault == DP_DESYNC and all(lay.dp == 1 for lay in config.layouts):
            fail(f"error: --train-fault {DP_DESYNC} needs a data-parallel layout (dp2, tp2dp2)")
        if train_fault in ADAPTER_FAULTS and lora is None:
            fail(
                f"error: --train-fault {train_fault} needs a LoRA adapter to push: add --lora RANK"
            )
        per_step = training.prompts * training.group_size
        for lay in config.layouts:  # the smallest DP share must fill every microbatch
            if per_step // lay.dp < training.microbatches:
                fail(
                    f"error: --train-microbatches {training.microbatches}: layout {lay.name} "
                    f"gives each of its {lay.dp} data-parallel ranks {per_step // lay.dp} of the "
                    f"step's {per_step} sequences; give at most that many microbatches or more "
                    "--requests"
                )
        config = dataclasses.replace(config, training=training)
    from ..parity.reference import ReferenceUnavailable

    try:
        report = run_gate(config)
    except ReferenceUnavailable as exc:  # before any layout ran: invalid input, exit 2
        fail(f"error: {exc}")
    to_stdout = json_path is not None and str(json_path) == "-"
    click.echo(table(report), err=to_stdout)  # with --json -, stdout is the JSON alone
    if json_path is not None:
        text = json.dumps(report, indent=2)
        if to_stdout:
            click.echo(text)
        else:
            json_path.write_text(text + "\n")
    sys.exit(EXIT_OK if passed(report) else EXIT_DRIFT)


def _rollouts(text, arch, lora, train_steps, inject_faults) -> tuple[str, ...]:
    """``--rollouts`` checked (``parity/rollout_targets.py``); exit 2 in one line."""
    from ..parity import rollout_targets as rt

    if text is None:
        return ()
    try:
        names = rt.parse_rollouts(text)
        rt.check_rollouts(
            names, arch.family, lora=lora is not None, train_steps=train_steps,
            inject_faults=inject_faults,
        )  # fmt: skip
    except rt.RolloutTargetError as exc:
        fail(f"error: {exc}")
    return names


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
        fail(f"error: --lora {text!r}: rank {rank} exceeds {contract_id}'s lora.max_rank "
             f"{section['max_rank']}")  # fmt: skip
    if alpha > section["max_alpha"]:
        fail(f"error: --lora {text!r}: alpha {alpha:g} exceeds {contract_id}'s lora.max_alpha "
             f"{section['max_alpha']:g}")  # fmt: skip
    from ..adapters.lora import CHECKPOINT_ADAPTER_FILE, random_adapter
    from ..parity.targets import rollout_adapter

    modules = tuple(section["target_modules"])
    if isinstance(weights, dict):
        arch = rollout_adapter().ModelArch.from_profile(schema.model_profile_for(contract_id))
        return {**weights, **random_adapter(arch, modules, rank, alpha)}
    if scratch is None:
        fail("error: --lora runs on the reference model or a --model NAME checkpoint (built "
             "here); a --checkpoint folder is not written into: export the adapter beside it "
             "and pass --lora-adapter on the reference model instead")  # fmt: skip
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
        fail("error: --lora-adapter runs on the contract's reference model (random weights); "
             "--checkpoint with --lora-adapter is not supported yet")  # fmt: skip
    profile = schema.model_profile_for(contract_id)
    try:
        serving = check_adapter_dir(
            folder, contract_id, select_checkpoint(contract_id, "reference"),
            family_for(profile.family),
        )  # fmt: skip
    except AdapterError as exc:
        fail(f"error: {exc}")
    modules = tuple(sorted(schema.CONTRACT_DATA[contract_id]["lora"]["target_modules"]))
    if serving.target_modules != modules:
        fail(f"error: --lora-adapter {folder}: the gate serves adapters on every "
             f"lora.target_modules ({', '.join(modules)}); this one adapts "
             f"{', '.join(serving.target_modules)}")  # fmt: skip
    import torch
    from safetensors.torch import load_file

    from ..adapters.lora import LORA_ALPHA_KEY

    adapter = {
        k.removeprefix(PEFT_PREFIX): v.float() for k, v in load_file(folder / WEIGHTS_FILE).items()
    }
    adapter[LORA_ALPHA_KEY] = torch.tensor(serving.alpha, dtype=torch.float64)
    return {**weights, **adapter}


def _training_config(config, steps: int, fault: str | None, lr: float | None,
                     requests: int | None, sizes: tuple[int, int, int],
                     own_prompt: bool = False):  # fmt: skip
    """``config`` running ``steps`` RL steps (``own_prompt``: at ``TrainingConfig``'s prompt
    length, not the one-shot workload's); exit 2 for an unknown ``--train-fault``."""
    import dataclasses

    from ..parity.harness import GateRun
    from ..parity.training import TrainingConfig, training_faults

    if fault is not None and fault not in (known := training_faults(GateRun(config))):
        fail(f"error: --train-fault {fault!r}: unknown; known: {', '.join(known)}")
    training = TrainingConfig(
        steps, prompts=requests or TrainingConfig.prompts,
        prompt_tokens=TrainingConfig.prompt_tokens if own_prompt else sizes[1],
        new_tokens=sizes[2], lr=lr or TrainingConfig.lr, fault=fault,
    )  # fmt: skip
    return dataclasses.replace(config, training=training)


def _check_blocks(contract_id: str, profile, trainers: list[str]) -> None:
    """Both sides (the rollout and every trainer target in ``trainers``) implement every MLP
    block the contract's models have, else one line, exit 2 (before any worker starts)."""
    from ..adapters.families import family_for
    from ..parity.targets import adapter, rollout_target

    family = family_for(profile.family)
    models = (*profile.checkpoints, profile.reference_model)
    needed = frozenset().union(*(family.mlp_blocks(d) for d in models))
    sides = [("rollout", rollout_target()), *(("trainer", t) for t in trainers)]
    for role, target in sides:
        have = adapter(target).MLP_BLOCKS
        if missing := sorted(needed - have):
            fail(
                f"error: {contract_id}: the {role} side ({target}) is not implemented yet for "
                f"the {', '.join(missing)} block of {family.name} models (it implements: "
                f"{', '.join(sorted(have))}); parity needs both sides"
            )


def _check_lora_trainers(trainers: list[str]) -> None:
    """Every trainer target in ``trainers`` runs LoRA adapters (its adapter's ``LORA``), else
    one line, exit 2 (before any worker starts)."""
    from ..codegen.targets import targets_for_role
    from ..parity.targets import adapter

    able = [t.name for t in targets_for_role("trainer") if getattr(t.runtime(), "LORA", False)]
    for name in trainers:
        if not getattr(adapter(name), "LORA", False):
            fail(
                f"error: --lora: the {name} trainer does not run LoRA adapters yet (trainers "
                f"that do: {', '.join(able) or 'none'}); give --trainers {','.join(able[:1])}"
            )


def _default_trainers(contract_id: str, layouts: str | None) -> list[str]:
    """Without ``--trainers``: every trainer target with the contract that runs one of the
    layouts (``--layouts``, else the defaults): the model-parallel trainer for ``tp1,…``, the
    FSDP trainer for ``fsdpN``."""
    from ..parity.layouts import LayoutError, parse_layouts
    from ..parity.targets import runs_layout, trainer_targets

    try:
        wanted = parse_layouts(layouts or DEFAULT_LAYOUTS)
    except LayoutError:
        wanted = []  # reported where the layouts are checked
    found = trainer_targets(contract_id)
    return [t for t in found if any(runs_layout(t, lay) for lay in wanted)] or found[:1]


def _layouts_per_trainer(
    chosen: list, trainers: list[str], defaults: bool, explicit: bool
) -> tuple[list, list[str]]:
    """Each trainer target runs the layouts of its axes (``targets.runs_layout``): with no
    ``--layouts``, a target's own ``DEFAULT_LAYOUTS`` (where its adapter has them) join the
    defaults; a default trainer that runs none of the layouts is left out, one named in
    ``--trainers`` that runs none is refused."""
    from ..parity.layouts import LayoutError, parse_layouts
    from ..parity.targets import adapter, runs_layout

    if defaults and explicit:
        for name in trainers:
            extra = getattr(adapter(name), "DEFAULT_LAYOUTS", None)
            if extra:
                chosen = chosen + [
                    lay for lay in parse_layouts(extra) if lay.name not in {c.name for c in chosen}
                ]
        chosen = [lay for lay in chosen if any(runs_layout(t, lay) for t in trainers)]
    idle = [t for t in trainers if not any(runs_layout(t, lay) for lay in chosen)]
    if idle and explicit:
        axes = ", ".join(sorted(adapter(idle[0]).LAYOUT_AXES))
        raise LayoutError(
            f"--trainers {idle[0]}: none of the layouts {[lay.name for lay in chosen]} is one it "
            f"runs (its axes: {axes}); add such layouts to --layouts"
        )
    return chosen, [t for t in trainers if t not in idle]


def _fit_gpus(layouts: list, gpus: int, given: bool) -> list:
    """One GPU per trainer rank: the default layouts stop at the GPUs there are; a layout asked
    for (``given``) that needs more is refused with one line, exit 2, before anything starts."""
    if not given:
        return [lay for lay in layouts if lay.world_size <= gpus]
    if too_big := [lay for lay in layouts if lay.world_size > gpus]:
        lay = too_big[0]
        also = f" (also {', '.join(x.name for x in too_big[1:])})" if too_big[1:] else ""
        fail(
            f"error: layout {lay.name} needs {lay.world_size} CUDA devices, {gpus} visible{also}; "
            f"give --layouts of at most {gpus} trainer rank{'s' if gpus != 1 else ''} each "
            f"(e.g. tp1) or run where {lay.world_size} CUDA devices are visible"
        )
    return layouts


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count()
