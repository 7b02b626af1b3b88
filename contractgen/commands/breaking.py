"""``contractgen breaking``: changes that would alter a shipped contract id, against a baseline."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..codegen.breaking import (
    BaselineError,
    Side,
    compare,
    format_github,
    format_json,
    format_text,
    load_baseline,
)
from ..codegen.breaking.baseline import git_toplevel
from ..schema.loader import LoadedContract
from ._common import EXIT_DRIFT, EXIT_OK, fail, handle_errors, project_from

FORMATS = {"text": format_text, "json": format_json, "github": format_github}


@click.command("breaking")
@click.option(
    "--against", required=True, metavar="REF|DIR",
    help="Baseline: a git ref of the project's repository (main, a tag, HEAD~1) or a directory "
    "of contracts (or a project root with contractgen.toml). An existing directory wins.",
)  # fmt: skip
@click.option(
    "--format", "fmt", type=click.Choice(sorted(FORMATS)), default="text", show_default=True,
    help="text, json, or github (workflow annotations).",
)  # fmt: skip
@click.option("-v", "--verbose", is_flag=True, help="Also list non-breaking changes (info).")
@click.pass_context
@handle_errors
def command(ctx: click.Context, against: str, fmt: str, verbose: bool) -> None:
    """Exit 1 when the contracts change what a shipped id means, else 0.

    Breaking: changing the numerics of an existing id (identity, model profile, a checkpoint's
    dims, parallel support, kernel or runtime policy), removing an id or a checkpoint, removing a
    public name of a generated module. Fine: adding a contract or a checkpoint, editing a
    description, comments or formatting. Change numerics with a new id: `contractgen new`.
    """
    project = project_from(ctx)
    try:
        baseline = load_baseline(against, project.config)
    except BaselineError as exc:
        fail(f"error: {exc}")
    config = project.config
    new_files = {lc.id: _display(lc, config.root) for lc in project.contracts}
    findings = compare(
        Side(baseline.contracts, baseline.files, baseline.generated),
        Side(project.contracts, new_files),
        config,
    )
    if fmt == "github":
        out, err = format_github(findings, against, verbose, prefix=_repo_prefix(config.root))
    else:
        out, err = FORMATS[fmt](findings, against, verbose)
    click.echo(out, nl=False)
    click.echo(err, nl=False, err=True)
    sys.exit(EXIT_DRIFT if any(f.breaking for f in findings) else EXIT_OK)


def _display(lc: LoadedContract, root: Path) -> str:
    try:
        return lc.path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return lc.path.as_posix()


def _repo_prefix(root: Path) -> str:
    """The project root relative to its git repository, for annotation paths GitHub can place."""
    top = git_toplevel(root)
    if top is None:
        return ""
    try:
        rel = root.resolve().relative_to(top.resolve()).as_posix()
    except ValueError:
        return ""
    return "" if rel == "." else f"{rel}/"
