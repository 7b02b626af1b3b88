"""``contractgen handshake``: may this rollout and this trainer start together?"""

from __future__ import annotations

from pathlib import Path

import click

from ..codegen.config import ProjectConfig
from ..codegen.targets import UnknownTargetError, by_role
from ._common import EXIT_DRIFT, fail, handle_errors, use_project_from


def _package_dir(path: Path, target: str, config: ProjectConfig) -> Path:
    """``path`` itself when it holds schema.py, else the target's vendored package inside it."""
    return path if (path / "schema.py").is_file() else path / config.package(target)


@click.command("handshake")
@click.option(
    "--rollout",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="SGLang repo (or its vendored true_on_policy package).",
)
@click.option(
    "--trainer",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Megatron-LM repo (or its vendored true_on_policy package).",
)
@click.option(
    "--rollout-target", default=None, metavar="NAME",
    help="The rollout's target in the registry [default: the rollout role's default, sglang].",
)  # fmt: skip
@click.option(
    "--trainer-target", default=None, metavar="NAME",
    help="The trainer's target in the registry [default: the trainer role's default, megatron].",
)  # fmt: skip
@click.option("--contract", "contract_id", default=None, help="Contract both sides run.")
@click.option(
    "--rollout-contract", default=None, help="Contract the rollout runs [default: --contract]."
)
@click.option(
    "--trainer-contract", default=None, help="Contract the trainer runs [default: --contract]."
)
@click.pass_context
@handle_errors
def command(
    ctx: click.Context,
    rollout: Path,
    trainer: Path,
    contract_id: str | None,
    rollout_contract: str | None,
    trainer_contract: str | None,
    rollout_target: str | None = None,
    trainer_target: str | None = None,
) -> None:
    """Compare the rollout's and the trainer's contract id and fingerprint.

    Exit 0 when both run the same contract from intact, identical vendored copies; exit 1 with
    the reason otherwise (different contract, different version, hand-edited copy).
    """
    project = use_project_from(ctx)
    config = project.config
    ids = (rollout_contract or contract_id, trainer_contract or contract_id)
    if None in ids:
        raise click.UsageError("give --contract, or both --rollout-contract and --trainer-contract")
    known = [lc.id for lc in project.contracts]
    for cid in dict.fromkeys(ids):
        if cid not in known:
            fail(f"error: unknown contract {cid!r}; `contractgen list` shows the known ones: "
                 f"{', '.join(known)}")  # fmt: skip
    try:
        targets = (
            by_role("rollout", rollout_target, config).name,
            by_role("trainer", trainer_target, config).name,
        )
    except UnknownTargetError as exc:
        fail(f"error: {exc}")
    launcher = by_role("launcher", None, config).runtime()
    HandshakeError, check_handshake = launcher.HandshakeError, launcher.check_handshake
    reports = [
        launcher.handshake_report(_package_dir(path, target, config), cid, side)  # type: ignore[arg-type]
        for path, target, cid, side in (
            (rollout, targets[0], ids[0], "rollout"),
            (trainer, targets[1], ids[1], "trainer"),
        )
    ]
    try:
        agreed = check_handshake(*reports)
    except HandshakeError as exc:
        fail(f"error: {exc}", EXIT_DRIFT)
    click.echo(f"handshake ok: {agreed}")
