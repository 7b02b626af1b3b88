"""``contractgen adopt``: take over a hand-kept vendored package, name by name, then sync."""

from __future__ import annotations

import sys

import click

from ..codegen.adopt import AdoptPlan, NameChange, plan_adopt
from ..codegen.sync import sync
from ._common import EXIT_DRIFT, EXIT_OK, fail, handle_errors, parse_repo_options, project_from


def _short(text: str, limit: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 15] + f"… ({len(text)} chars)"


def _line(c: NameChange, allowed: set[str]) -> str:
    where = f"{c.target}:{c.file}"
    if c.kind == "added":
        return f"  + {where}: {c.name} = {_short(c.new)}"
    if c.kind == "changed":
        return f"  ~ {where}: {c.name}: {_short(c.old, 60)} -> {_short(c.new, 60)}"
    if c.provided_by:
        return f"  - {where}: {c.name} (still provided by {c.provided_by})"
    if c.name in allowed:
        return f"  - {where}: {c.name} (dropped: --allow-drop {c.name})"
    return f"  - {where}: {c.name} (REFUSED: dropping a public name)"


@click.command("adopt")
@click.option(
    "--repo", "repos", multiple=True, required=True, metavar="NAME=PATH",
    help="Sibling repo whose hand-kept package to take over (NAME: sglang, megatron, launcher).",
)  # fmt: skip
@click.option(
    "--allow-drop", "allow", multiple=True, metavar="NAME",
    help="A public name the generated package may drop (repeat for several).",
)  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Report the name-by-name changes; write nothing.")
@click.pass_context
@handle_errors
def command(
    ctx: click.Context, repos: tuple[str, ...], allow: tuple[str, ...], dry_run: bool
) -> None:
    """Replace a hand-kept vendored package with the generated one, after a semantic diff.

    Reports, name by name, what each file sync would overwrite gains (+), changes (~) or drops
    (-). Exit 1 (nothing written) when a public name would be dropped that no generated module
    provides and --allow-drop does not name; else syncs the package (the repo's own other files
    are left alone).
    """
    project = project_from(ctx)
    targets = parse_repo_options(repos)
    for target, path in targets:
        if not path.is_dir():
            fail(f"error: --repo {target}={path}: not a directory")
    allowed = set(allow)
    plan = AdoptPlan()
    for target, path in targets:
        try:
            plan.changes += plan_adopt(project.vendored, target, path, project.config).changes
        except ValueError as exc:
            fail(f"error: {exc}")
    for c in plan.changes:
        click.echo(_line(c, allowed))
    counts = {k: sum(c.kind == k for c in plan.changes) for k in ("added", "changed", "dropped")}
    summary = ", ".join(f"{n} {k}" for k, n in counts.items())
    refused = plan.refused(allowed)
    if refused:
        names = ", ".join(sorted({c.name for c in refused}))
        click.echo(
            f"adopt: refused, it would drop public name(s) {names}; keep them in a contract or "
            "template, or pass --allow-drop NAME for each (nothing written)",
            err=True,
        )
        sys.exit(EXIT_DRIFT)
    if dry_run:
        click.echo(f"adopt --dry-run: {summary}; nothing written")
        sys.exit(EXIT_OK)
    _, written = sync(project.vendored, targets, project.config, force=True)
    for f in written:
        verb = "removed" if f.action == "remove" else f"{f.action}d"
        click.echo(f"{verb} {f.target}:{f.repo / f.rel}")
    click.echo(f"adopt: {summary}; {len(written)} file(s) written")
