"""``contractgen sync``: write vendored copies into sibling repositories."""

from __future__ import annotations

import sys

import click

from ..codegen.sync import sync
from ._common import EXIT_DRIFT, EXIT_OK, handle_errors, parse_repo_options, project_from


@click.command("sync")
@click.option(
    "--repo", "repos", multiple=True, required=True, metavar="NAME=PATH",
    help="Sibling repo to write into (NAME: a target, e.g. sglang, megatron, fsdp, launcher, or a repo, sglang/Megatron-LM/miles, for all its targets).",
)  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Show the diff of what would change; write nothing.")
@click.option("--force", is_flag=True, help="Overwrite vendored files that were edited by hand.")
@click.pass_context
@handle_errors
def command(ctx: click.Context, repos: tuple[str, ...], dry_run: bool, force: bool) -> None:
    """Write each target's vendored package into its sibling repo, atomically.

    Refuses (exit 1, nothing written) to overwrite a vendored file whose content no longer matches
    its own fingerprint unless --force; never writes outside the vendored package.

    With `kernels = true` under `[targets.NAME]` in contractgen.toml it also writes the stamped,
    self-contained kernel module `tp_invariant_ops.py` (torch + triton only) with SGLang's
    `matmul_tp_persistent(A, B, bias=None)` and `tree_all_reduce_sum(x, device_group=None)`, cut
    from contractgen's own kernels (v1 numerics only; docs/sibling-ci.md).
    """
    project = project_from(ctx)
    targets = parse_repo_options(repos, project.config)
    plan, written = sync(project.vendored, targets, project.config, force=force, dry_run=dry_run)
    if dry_run:  # the diff of every change, refused ones included, so a migration can be read
        for f in plan.changes:
            click.echo(f"would {f.action}{' (refused)' if f.problem else ''}: {f.target}:{f.rel}")
            click.echo(f.diff, nl=not f.diff.endswith("\n"))
    for f in plan.refused:
        click.echo(f"refused: {f.problem}", err=True)
    if plan.refused:
        click.echo("sync: nothing written", err=True)
        sys.exit(EXIT_DRIFT)
    if dry_run:
        click.echo(f"sync --dry-run: {len(plan.changes)} file(s) would change; nothing written")
        sys.exit(EXIT_OK)
    for f in written:
        verb = "removed" if f.action == "remove" else f"{f.action}d"
        click.echo(f"{verb} {f.target}:{f.repo / f.rel}")
    unchanged = len(plan.files) - len(plan.changes)
    click.echo(f"sync: {len(plan.changes)} written, {unchanged} already identical")
