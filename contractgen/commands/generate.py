"""``contractgen generate``: render every contract into ``generated/``."""

from __future__ import annotations

import click

from ..codegen.drift import check_generated
from ..codegen.generated_dir import check_generated_dir
from ..codegen.writer import atomic_write, safe_destination
from ._common import handle_errors, project_to_write


@click.command("generate")
@click.pass_context
@handle_errors
def command(ctx: click.Context) -> None:
    """Render all contracts into generated/ and remove files no contract produces.

    Everything is validated, rendered and parsed in memory first: when any contract is invalid,
    nothing is written (exit 2).
    """
    project = project_to_write(ctx, "generate")
    rendered = project.rendered
    gen = project.config.generated_dir
    check_generated_dir(project.config, rendered)  # never delete a file contractgen did not write
    drift = check_generated(rendered, project.config)
    writes = [
        (safe_destination(gen, d.rel), rendered[d.rel], d)
        for d in drift
        if d.kind in ("stale", "missing")
    ]
    removals = [
        (safe_destination(gen, d.rel), d) for d in drift if d.kind in ("orphaned", "leftover")
    ]
    for dest, content, d in writes:
        atomic_write(dest, content)
        click.echo(f"{'created' if d.kind == 'missing' else 'updated'} {d.path}")
    for dest, d in removals:
        dest.unlink()
        why = (
            "an interrupted write's temp file"
            if d.kind == "leftover"
            else "no contract produces it"
        )
        click.echo(f"removed {d.path} ({why})")
    click.echo(
        f"generate: {len(rendered)} files from {len(project.contracts)} contracts, "
        f"{len(writes) + len(removals)} changed"
    )
