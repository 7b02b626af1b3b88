"""``contractgen parity``: the exact-zero gate between rollout and trainer logprobs.

The command is a thin layer: click's flags become a ``ParityOptions`` (``parity_options``), the
weights come from ``parity_inputs``, the trainer targets and layouts from ``parity_layouts``, and
the ``GateConfig`` built here runs through ``contractgen.parity.gate``. The gate's modules import
torch and megatron-core, so they are imported inside the functions (``contractgen --help`` stays
light).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from ..parity.workload import WORKLOADS
from ._common import EXIT_DRIFT, EXIT_OK, fail, handle_errors, use_project_from
from .parity_inputs import _with_adapter_dir, _with_lora, load_weights, parse_lora
from .parity_layouts import (
    _check_blocks,
    _check_lora_trainers,
    _default_trainers,
    _fit_gpus,
    choose_layouts,
    rollout_tps_of,
)
from .parity_options import (
    DEFAULT_CONTRACT,
    DEFAULT_LAYOUTS,
    ParityOptions,
    check_planted_bugs,
    check_training_flags,
    with_training,
)

__all__ = ["DEFAULT_CONTRACT", "DEFAULT_LAYOUTS", "ParityOptions", "command", "parse_lora"]
_REEXPORTED = (_fit_gpus, _with_adapter_dir, _with_lora)  # tests import them from here


@click.command("parity")
@click.option(
    "--contract", "contract_id", default=DEFAULT_CONTRACT, show_default=True, help="Contract id."
)
@click.option(
    "--checkpoint",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Hugging Face checkpoint directory (config.json + *.safetensors). Default: the contract's "
    "tiny reference model with seeded random weights.",
)
@click.option(
    "--model",
    "model_name",
    default=None,
    help="Build a random-weight checkpoint of this model of the contract's profile (e.g. "
    "Qwen3-4B: its real dims, transformers' own init, seeded) in a temporary folder and gate it "
    "as --checkpoint would. Needs transformers; the weights are held in memory while written.",
)
@click.option(
    "--layouts",
    default=None,
    help=f"Comma-separated layouts (default: {DEFAULT_LAYOUTS} and tp2pp2, and for a contract "
    "with expert parallelism ep2 and tp2ep2, each where the contract and the model allow it, tp1 "
    "always; with --inject-faults, tp4 too where allowed). epN: experts over N ranks (ep2 alone adds two attention "
    "data-parallel ranks, each scoring half the sequences).",
)
@click.option(
    "--dtype",
    type=click.Choice(["contract", "float32"]),
    default="contract",
    show_default=True,
    help="'float32' sets every dtype of the contract to float32: a diagnostic mode for reference "
    "checks, marked as such in the report.",
)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the JSON report here ('-' for stdout).",
)
@click.option(
    "--inject-faults",
    is_flag=True,
    help="Flip every policy field on one side; each must be detected, or explained by the "
    "contract's 'unobservable' notes. A fault no layout detects gets a second chance at the "
    "first layout on the 'large' workload (when the run's own is smaller).",
)
@click.option(
    "--rollout-tps",
    default=None,
    help="Comma-separated rollout TP sizes, each compared with the TP=1 reference (always run). "
    "Default: every rollout TP of the contract the model can run.",
)
@click.option(
    "--workload",
    type=click.Choice(sorted(WORKLOADS)),
    default="default",
    show_default=True,
    help="Workload preset: 'default' (4 requests, 176-token longest prompt, 10 new tokens: 40 "
    "scored, two requests scored past two 64-position KV chunks) or 'large' (16 requests, 128-token longest prompt, 16 new tokens: 256 scored); "
    "--requests/--prompt-tokens/--new-tokens override its parts.",
)
@click.option(
    "--requests", type=click.IntRange(min=1), default=None, help="Concurrent requests (default 4)."
)
@click.option(
    "--prompt-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Longest prompt; the others spread below it (default 176; with " "--train-steps 70).",
)
@click.option(
    "--new-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Tokens generated per request (default 10).",
)
@click.option(
    "--grads",
    is_flag=True,
    help="Also compare the trainer's gradient of the scored logprobs' sum with float64 autograd "
    "at every layout (every TP shard and PP stage).",
)
@click.option(
    "--no-reference",
    is_flag=True,
    help="Skip the float32 agreement check with Hugging Face transformers.",
)
@click.option(
    "--plant-bug",
    "plant_bugs",
    multiple=True,
    metavar="NAME",
    help="Self-test: plant this bug (silu_glu_sign_flip, tp_reduce_skipped) in the shared kernel library, so on BOTH sides; the gate "
    "must then FAIL (exit 1). Repeatable. attention_dk_scale_dropped changes only gradients: "
    "with --grads, or with --train-steps (its step-0 gradient check).",
)
@click.option(
    "--train-steps",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Run the gate over N steps of RL instead: per trainer layout, rollout (weights pushed "
    "from the trainer), a toy verifiable reward, a PPO-clip step through the trainer with "
    "megatron-core's optimizer, weights pushed back; every step's pairs must be exact and the "
    "importance ratio exactly 1. --requests counts prompts here (default 2, 4 samples each). "
    "0: the one-shot gate.",
)
@click.option(
    "--train-fault",
    default=None,
    metavar="NAME",
    help="With --train-steps: a fault for the whole run, which must make it FAIL: any "
    "--inject-faults name (one side only; the ratio leaves 1 at step 0) or sync.stale_shard "
    "(one rollout rank keeps an old shard; step 1 differs); with --lora, sync.stale_adapter "
    "(the rollout keeps step 0's adapter) or sync.no_adapter (it serves none): the adapter "
    "digest it reports differs from the pushed one.",
)
@click.option(
    "--train-lr",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="With --train-steps: the optimizer's learning rate (default 1e-2).",
)
@click.option(
    "--train-temperature",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="With --train-steps: the rollout's sampling temperature (default 1); the trainer's "
    "logprobs and loss are of the same temperature-scaled distribution.",
)
@click.option(
    "--train-microbatches",
    type=click.IntRange(min=1),
    default=None,
    help="With --train-steps: microbatches per step on each data-parallel rank (gradient "
    "accumulation in fp32; default 1). DP layouts (dp2, tp2dp2) split the step's sequences "
    "over their DP ranks first.",
)
@click.option(
    "--train-distributed-optimizer",
    is_flag=True,
    help="With --train-steps: shard the optimizer state over the data-parallel ranks "
    "(reduce-scatter of the gradient, AdamW on each rank's fp32 shard, all-gather), as "
    "megatron-core's distributed optimizer does, with fixed-order collectives.",
)
@click.option(
    "--no-grad-check",
    is_flag=True,
    help="With --train-steps: skip the step-0 gradient check (each layout's float32 gradient "
    "on the step's samples vs float64 autograd through transformers, as --grads).",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Also fail (exit 1) when an op the contract replaces ran as the stock op on the scored "
    "path (F.linear / torch.matmul, SDPA, log_softmax, rms_norm / layer_norm outside every "
    "contract kernel, seen by a torch function mode), or when a run called no contract kernel "
    "of a kind (matmul, attention, norm, log-softmax). The report's kernel_calls says which.",
)
@click.option(
    "--trainers",
    default=None,
    metavar="NAME[,NAME]",
    help="Trainer targets to pair with the rollout, each at every layout, reported per pair. "
    "Default: every trainer target of the registry (codegen/targets.py and contractgen.toml "
    "plugins) whose generated policy has the contract.",
)
@click.option(
    "--rollouts",
    default=None,
    metavar="NAME[,NAME]",
    help="Rollout targets: sglang (the reference engine, the default) and vllm (real vLLM in "
    ".venv-vllm: tools/install-vllm.sh). Each runs the workload and is compared bitwise with the "
    "reference rollout and with every trainer at every layout (pairs name their rollout_target).",
)
@click.option(
    "--lora",
    "lora",
    default=None,
    metavar="RANK[,ALPHA]",
    help="A LoRA contract only: add a seeded random adapter (B != 0) of this rank on the "
    "contract's lora.target_modules, served unmerged on both sides; the transformers check "
    "runs through peft. ALPHA defaults to 1.5 x RANK (a scale that is not a power of two, so "
    "where and in which dtype it is applied shows in the bits).",
)
@click.option(
    "--lora-adapter",
    "lora_adapter",
    default=None,
    metavar="DIR",
    type=click.Path(path_type=Path),
    help="A LoRA contract only, instead of --lora: serve this PEFT adapter folder "
    "(adapter_config.json + adapter_model.safetensors, e.g. from export_peft) on the reference "
    "model; checked as `plan --lora-adapter` checks it (exit 2 naming the bad field or tensor).",
)
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
@click.pass_context
@handle_errors
def command(ctx: click.Context, **params: Any) -> None:
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
    run_command(ctx, ParityOptions.from_params(params))


def run_command(ctx: click.Context, opts: ParityOptions) -> None:
    """Check the options, build the ``GateConfig``, run the gate, report; exit 0 / 1 / 2."""
    # Worker processes inherit this: megatron-core warns at import that Apex and Transformer
    # Engine are absent, which is expected here (the contract's layers replace their kernels).
    os.environ.setdefault(
        "PYTHONWARNINGS",
        "ignore:Apex is not installed:UserWarning,"
        "ignore:Transformer Engine and Apex are not installed:UserWarning",
    )
    from ..codegen.vendored import load_target
    from ..parity.targets import rollout_target

    use_project_from(ctx)
    schema = load_target(rollout_target()).schema
    contract_id = opts.model.contract_id
    schema.get_contract_schema(contract_id)  # unknown ids: exit 2 listing the known ones
    trainers = _select_trainers(opts, schema)
    if opts.model.device == "cuda":
        import torch  # heavy: only for --device cuda

        if not torch.cuda.is_available():
            fail("error: --device cuda: no CUDA device is available here")
    weights, scratch, serves_adapter = load_weights(opts, schema)
    check_planted_bugs(opts)
    check_training_flags(opts)
    config = gate_config(opts, weights, trainers)
    if opts.training.train_steps:
        config = with_training(config, opts, serves_adapter)
    report = _run_gate(config)
    del scratch  # the --model checkpoint's folder lives until the gate is done
    _write_report(report, opts.output.json_path)


def _select_trainers(opts: ParityOptions, schema) -> list[str]:
    """The trainer targets paired with the rollout (``--trainers``, else the defaults), each
    implementing the contract's blocks (and LoRA with ``--lora``); exit 2 otherwise."""
    from ..codegen.targets import UnknownTargetError
    from ..parity.targets import parse_trainers

    contract_id, trainers = opts.model.contract_id, opts.layouts.trainers
    try:
        chosen = parse_trainers(trainers) if trainers is not None else []
    except UnknownTargetError as exc:
        fail(f"error: --trainers: {exc}")
    chosen = chosen or _default_trainers(contract_id, opts.layouts.layouts)
    if not chosen:
        fail(f"error: {contract_id}: no trainer target's generated policy has this contract")
    if len(chosen) > 1 and opts.training.train_steps:
        fail(
            f"error: --train-steps runs one trainer target at a time (got --trainers "
            f"{','.join(chosen)}); give --trainers NAME"
        )
    _check_blocks(contract_id, schema.model_profile_for(contract_id), chosen)
    if opts.lora.lora is not None:
        _check_lora_trainers(chosen)
    return chosen


def gate_config(opts: ParityOptions, weights: object, trainers: list[str]):
    """The one-shot ``GateConfig`` of ``opts``: its layouts and rollout TPs resolved and checked
    against the model, the contract and the visible GPUs (exit 2 with one line otherwise)."""
    from ..parity.gate import check_layouts
    from ..parity.harness import GateConfig
    from ..parity.layouts import LayoutError
    from ..parity.targets import rollout_adapter
    from ..parity.workload import make_workload

    model, checks = opts.model, opts.checks
    sizes = opts.workload.sizes()
    arch = rollout_adapter().arch_of(model.contract_id, weights)
    if sizes[1] + sizes[2] > arch.max_position_embeddings:
        fail(
            f"error: --prompt-tokens {sizes[1]} + --new-tokens {sizes[2]} exceeds "
            f"max_position_embeddings={arch.max_position_embeddings} of {arch.name}"
        )
    try:
        gpus = _cuda_device_count() if model.device == "cuda" else None
        chosen, trainers = choose_layouts(opts, arch, trainers, gpus)
        tps = rollout_tps_of(opts, arch, gpus)
        config = GateConfig(
            model.contract_id,
            weights,
            chosen,
            None if model.dtype == "contract" else model.dtype,
            model.device,
            checks.inject_faults,
            not opts.output.quiet,
            rollout_tps=tps,
            workload=make_workload(*sizes),
            hf_reference=not checks.no_reference,
            grads=checks.grads,
            planted_bugs=tuple(checks.plant_bugs),
            strict=checks.strict,
            trainers=tuple(trainers),
            rollouts=_rollouts(opts, arch),
        )
        check_layouts(config)
    except LayoutError as exc:
        fail(f"error: {exc}")
    return config


def _rollouts(opts: ParityOptions, arch) -> tuple[str, ...]:
    """``--rollouts`` checked against the run (``parity/rollout_targets.py``); exit 2 in one
    line."""
    from ..parity import rollout_targets as rt

    text = opts.layouts.rollouts
    if text is None:
        return ()
    try:
        names = rt.parse_rollouts(text)
        rt.check_rollouts(
            names,
            arch.family,
            lora=opts.lora.lora is not None or opts.lora.lora_adapter is not None,
            train_steps=opts.training.train_steps,
            inject_faults=opts.checks.inject_faults,
        )
    except rt.RolloutTargetError as exc:
        fail(f"error: {exc}")
    return names


def _run_gate(config) -> dict:
    """The gate's report; a reference that cannot run before any layout did: exit 2."""
    from ..parity.gate import run_gate
    from ..parity.reference import ReferenceUnavailable

    try:
        return run_gate(config)
    except ReferenceUnavailable as exc:  # before any layout ran: invalid input, exit 2
        fail(f"error: {exc}")


def _write_report(report: dict, json_path: Path | None) -> None:
    """The table on stdout (stderr with ``--json -``), the JSON where asked; exit 0 or 1."""
    from ..parity.gate import passed, table

    to_stdout = json_path is not None and str(json_path) == "-"
    click.echo(table(report), err=to_stdout)  # with --json -, stdout is the JSON alone
    if json_path is not None:
        text = json.dumps(report, indent=2)
        if to_stdout:
            click.echo(text)
        else:
            json_path.write_text(text + "\n")
    sys.exit(EXIT_OK if passed(report) else EXIT_DRIFT)


def _cuda_device_count() -> int:
    import torch  # heavy: only for --device cuda

    return torch.cuda.device_count()
