"""The ``contractgen`` command line: wires one module per verb (contractgen/commands/)."""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import click

from . import __version__

# Third-party import-time noise: megatron-core warns that Apex / Transformer Engine are absent
# (expected: the contract's layers replace their kernels) and about its own deprecated defaults.
# A command's output is its own; these say nothing about the user's input.
warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.core(\.|$)")
warnings.filterwarnings("ignore", category=FutureWarning, module=r"megatron\.core(\.|$)")

# verb -> module under contractgen.commands exposing ``command``
COMMANDS = (
    "list",
    "schema",
    "generate",
    "check",
    "sync",
    "parity",
    "breaking",
    "new",
    "add_checkpoint",
    "plan",
    "handshake",
    "adopt",
)


class _Main(click.Group):
    """The group that turns Ctrl-C into one line and exit 130, and an OS error anywhere into one
    line and exit 2, instead of click's ``Aborted!`` (exit 1) or a traceback."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        from .commands._common import EXIT_INTERRUPTED, EXIT_USAGE, os_error_line

        try:
            return super().invoke(ctx)
        except (KeyboardInterrupt, click.Abort):
            click.echo(
                "\ninterrupted (Ctrl-C): stopped; a sync in progress put back what it had written",
                err=True,
            )
            sys.exit(EXIT_INTERRUPTED)
        except OSError as exc:
            click.echo(f"error: {os_error_line(exc)}", err=True)
            sys.exit(EXIT_USAGE)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="contractgen")
@click.option(
    "--root", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Project root holding contractgen.toml (default: nearest above the current directory, "
    "else contractgen's built-in contracts).",
)  # fmt: skip
@click.option(
    "--contracts", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Directory of contract files (overrides the config).",
)  # fmt: skip
@click.pass_context
def main(ctx: click.Context, root: Path | None, contracts: Path | None) -> None:
    """Single source of truth for true-on-policy contracts across SGLang, Megatron and Miles.

    Exit codes: 0 ok, 1 drift / mismatch / parity failure, 2 invalid input or usage.
    """
    ctx.ensure_object(dict)
    ctx.obj["root"] = root
    ctx.obj["contracts"] = contracts


# The example every ``--help`` ends with (click prints the epilog last).
EXAMPLES = {
    "list": "contractgen list --json",
    "schema": "contractgen schema > schema/contract.schema.json",
    "generate": "contractgen --root . generate",
    "check": "contractgen check --repo sglang=../sglang --repo megatron=../Megatron-LM --json",
    "sync": "contractgen sync --repo sglang=../sglang --repo megatron=../Megatron-LM --dry-run",
    "parity": "contractgen parity --contract qwen3_dense_true_on_policy_v1 --layouts tp1,tp2 --json -",
    "breaking": "contractgen breaking --against main --format github",
    "new": "contractgen new --from qwen3_dense_true_on_policy_v4 --dry-run",
    "add_checkpoint": "contractgen add-checkpoint llama3_dense_true_on_policy_v1 ./Llama-3.2-1B "
    "--tp-sizes 1,2",
    "plan": "contractgen plan --contract qwen3_dense_true_on_policy_v1 --model Qwen3-4B --tp 2 --dp 4",
    "handshake": "contractgen handshake --rollout ../sglang --trainer ../Megatron-LM "
    "--contract qwen3_dense_true_on_policy_v1",
    "adopt": "contractgen adopt --repo miles=../miles --dry-run",
}


def _epilog(example: str) -> str:
    return f"\b\nExample:\n  {example}"


main.epilog = _epilog("contractgen --root . check --repo sglang=../sglang")
for _verb in COMMANDS:
    _command = importlib.import_module(f".commands.{_verb}", __package__).command
    _command.epilog = _epilog(EXAMPLES[_verb])
    main.add_command(_command)
