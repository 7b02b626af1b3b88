"""``contractgen check``: is generated/ fresh, and are vendored copies byte-identical."""

from __future__ import annotations

import json
import sys

import click

from ..codegen.drift import check_generated, check_repo
from ._common import EXIT_DRIFT, EXIT_OK, handle_errors, parse_repo_options, project_from


@click.command("check")
@click.option(
    "--repo", "repos", multiple=True, metavar="NAME=PATH",
    help="Also check the vendored copy in a sibling repo (NAME: sglang, megatron, launcher).",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report instead of text.")
@click.pass_context
@handle_errors
def command(ctx: click.Context, repos: tuple[str, ...], as_json: bool) -> None:
    """Exit 0 when generated/ (and every --repo) matches what the contracts render, else 1.

    Reports stale, missing and orphaned files with a unified diff.
    """
    project = project_from(ctx)
    rendered = project.rendered
    drift = check_generated(rendered, project.config)
    for target, path in parse_repo_options(repos):
        drift += check_repo(rendered, target, path, project.config)
    if as_json:
        report = {
            "ok": not drift,
            "contracts": [lc.id for lc in project.contracts],
            "files": len(rendered),
            "drift": [d.to_json() for d in drift],
        }
        click.echo(json.dumps(report, indent=2))
    else:
        for d in drift:
            click.echo(f"{d.kind}: {d.path}")
            if d.diff:
                click.echo(d.diff, nl=not d.diff.endswith("\n"))
        if drift:
            click.echo(
                f"check: {len(drift)} file(s) differ; run `contractgen generate` for generated/ "
                "and `contractgen sync --repo NAME=PATH` for sibling repos",
                err=True,
            )
        else:
            checked = 1 + len(repos)
            click.echo(f"check: ok ({len(rendered)} files, {checked} location(s))")
    sys.exit(EXIT_DRIFT if drift else EXIT_OK)
