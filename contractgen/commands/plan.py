"""``contractgen plan``: validate a layout against a contract and render the launch."""

from __future__ import annotations

import dataclasses
import os
import shlex

import click

from ..adapters.launcher import FORMATS, Layout, LayoutError, PlanError, build_plan
from ..adapters.launcher.sides import refusal
from ..codegen.targets import ROLES, by_role
from ._common import EXIT_USAGE, fail, handle_errors, use_project_from

_SIZE = click.IntRange(min=1)


@click.command("plan")
@click.option(
    "--contract", "contract_id", required=True, help="Contract id (see `contractgen list`)."
)
@click.option(
    "--tp", type=_SIZE, default=1, show_default=True, help="Training tensor parallel size."
)
@click.option(
    "--pp", type=_SIZE, default=1, show_default=True, help="Training pipeline parallel size."
)
@click.option(
    "--cp",
    type=_SIZE,
    default=1,
    show_default=True,
    help="Training (Ulysses) context parallel size.",
)
@click.option("--dp", type=_SIZE, default=1, show_default=True, help="Training data parallel size.")
@click.option(
    "--ep", type=_SIZE, default=1, show_default=True,
    help="Training expert parallel size (MoE contracts): whole experts per rank, folded over "
    "the TP x CP x DP ranks, so it must divide them.",
)  # fmt: skip
@click.option(
    "--rollout-tp", type=_SIZE, default=None, help="Rollout (SGLang) TP size [default: --tp]."
)
@click.option(
    "--rollout-dp", type=_SIZE, default=1, show_default=True, help="Rollout data parallel size."
)
@click.option(
    "--world", type=_SIZE, default=None, help="Training world size; must equal TP x PP x CP x DP."
)
@click.option(
    "--model",
    default=None,
    help="Checkpoint of the contract's model profile [default: its first]; `reference` for the reference model.",
)
@click.option(
    "--trainer-args", default="", metavar="ARGS",
    help="Your own Megatron/miles arguments for the same launch: refused (exit 2) where one "
    "undoes what the plan renders (e.g. --hidden-dropout 0.1) or is forbidden.",
)  # fmt: skip
@click.option(
    "--lora-adapter", "lora_adapter", default=None, metavar="DIR",
    help="A LoRA contract only: a PEFT adapter folder (adapter_config.json + "
    "adapter_model.safetensors) to serve; checked against the contract's lora limits and the "
    "model's shapes (exit 2 naming the bad field or tensor), then its SGLang flags are rendered.",
)  # fmt: skip
@click.option(
    "--format", "fmt", type=click.Choice(sorted(FORMATS)), default="text", show_default=True,
    help="text for people, json for tools, shell for `export` lines and the two command lines.",
)  # fmt: skip
@click.pass_context
@handle_errors
def command(
    ctx: click.Context,
    contract_id: str,
    tp: int,
    pp: int,
    cp: int,
    dp: int,
    ep: int,
    rollout_tp: int | None,
    rollout_dp: int,
    world: int | None,
    model: str | None,
    trainer_args: str,
    lora_adapter: str | None,
    fmt: str,
) -> None:
    """Validate a layout against the contract's model profile and render the launch.

    Prints the SGLang server arguments, the Megatron and miles arguments and the environment,
    each with the policy field it comes from and why. Exit 2 names every rule the layout breaks
    and the nearest valid sizes. NCCL_ALGO already set in the environment is kept.
    """
    project = use_project_from(ctx)
    if contract_id in {lc.id for lc in project.contracts}:  # an unknown id is refused below
        # each role's default target, looked up in the project's registry
        sides = [
            (role, t.name, t.repo) for role in ROLES for t in [by_role(role, None, project.config)]
        ]
        refused = refusal(contract_id, {t: project.implemented(t) for _, t, _ in sides}, sides)
        if refused:
            fail(f"error: {refused}", EXIT_USAGE)
    layout = Layout(
        tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, rollout_tp=rollout_tp, rollout_dp=rollout_dp,
        world=world,
    )  # fmt: skip
    try:
        plan = build_plan(contract_id, layout, model, environ=os.environ)
    except LayoutError as exc:
        fail(f"error: {exc}", EXIT_USAGE)
    except PlanError as exc:
        fail(f"error: {exc}", EXIT_USAGE)
    except KeyError as exc:  # unknown contract or checkpoint: their str lists the known names
        fail(f"error: {exc}", EXIT_USAGE)
    if lora_adapter is not None:
        from ..adapters.launcher.layout import subject_for
        from ..adapters.launcher.lora_adapter import AdapterError, check_adapter_dir

        family = subject_for(contract_id, layout, model).family
        try:
            serving = check_adapter_dir(lora_adapter, contract_id, plan.model, family)
        except AdapterError as exc:
            fail(f"error: {exc}", EXIT_USAGE)
        plan = dataclasses.replace(plan, lora=serving)
    conflicts = plan.trainer_conflicts(shlex.split(trainer_args))
    if conflicts:
        lines = "\n".join(f"  {c}" for c in conflicts)
        fail(f"error: --trainer-args undo the plan's determinism:\n{lines}", EXIT_USAGE)
    click.echo(
        "warning: a real SGLang rollout computes attention (FA3), norms, RoPE and the activation "
        "with its own kernels, which nothing here compares (see the plan's 'real SGLang' lines)",
        err=True,
    )
    if ep > 1:
        click.echo(
            f"warning: --ep {ep}: contractgen gates expert parallelism in the forward only (the "
            "token exchange has no contract-exact backward yet); do not train through it",
            err=True,
        )
    for flag, where in plan.needs_newer_sglang:
        click.echo(
            f"warning: {flag} needs a newer SGLang than {plan.sglang_release} (from {where})",
            err=True,
        )
    click.echo(FORMATS[fmt](plan), nl=False)
