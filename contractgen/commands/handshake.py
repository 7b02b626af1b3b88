"""``contractgen handshake``: may this rollout and this trainer start together?"""

from __future__ import annotations

from pathlib import Path

import click

from ..adapters.launcher.handshake import HandshakeError, check_handshake, handshake_report
from ..codegen.config import ProjectConfig
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
) -> None:
    """Compare the rollout's and the trainer's contract id and fingerprint.

    Exit 0 when both run the same contract from intact, identical vendored copies; exit 1 with
    the reason otherwise (different contract, different version, hand-edited copy).
    """
    config = use_project_from(ctx).config
    ids = (rollout_contract or contract_id, trainer_contract or contract_id)
    if None in ids:
        raise click.UsageError("give --contract, or both --rollout-contract and --trainer-contract")
    reports = [
        handshake_report(_package_dir(path, target, config), cid, side)  # type: ignore[arg-type]
        for path, target, cid, side in (
            (rollout, "sglang", ids[0], "rollout"),
            (trainer, "megatron", ids[1], "trainer"),
        )
    ]
    try:
        agreed = check_handshake(*reports)
    except HandshakeError as exc:
        fail(f"error: {exc}", EXIT_DRIFT)
    click.echo(f"handshake ok: {agreed}")
