"""``contractgen adopt``: take over a hand-kept vendored package, name by name, then sync."""

from __future__ import annotations

import json
import sys

import click

from ..codegen.adopt import AdoptPlan, Change, plan_adopt
from ..codegen.sync import sync
from ._common import EXIT_DRIFT, EXIT_OK, fail, handle_errors, parse_repo_options, project_from

NEW_PACKAGE_INIT = (
    b'"""True-on-policy contracts vendored by contractgen (`contractgen sync` keeps schema.py,\n'
    b"contracts.py and runtime_policy.py); this file is the repo's own: import from it what the\n"
    b'repo needs."""\n'
)
SIGNS = {"added": "+", "dropped": "-", "file": "*", "contracts": "="}


def _status(c: Change, refused: set[int]) -> str:
    if not c.refuse:
        return ""
    if id(c) in refused:
        if c.refuse == "config":
            return " [REFUSED: fix contractgen.toml]"
        return f" [REFUSED: {c.refuse} {c.name.split('(', 1)[0]}]"
    return f" [allowed: {c.refuse}]"


def _line(c: Change, refused: set[int]) -> str:
    values = f": {c.old} -> {c.new}" if c.old or c.new else ""
    if c.kind == "added":
        values = f" = {c.new}"
    elif c.kind == "dropped" and c.old:
        values = f" (was {c.old})"
    detail = c.detail.replace("\n", "\n      ")
    return (f"  {SIGNS.get(c.kind, '~')} {c.target}:{c.file}: {c.name}: {detail}{values}"
            f"{_status(c, refused)}")  # fmt: skip


def _summary(plan: AdoptPlan) -> str:
    counts = {k: sum(c.kind == k for c in plan.changes)
              for k in ("added", "dropped", "field", "param", "value", "error", "file")}  # fmt: skip
    probes = "; ".join(
        f"{t}: {d} of {r} probes differ" for t, (r, d) in sorted(plan.probes.items())
    )
    text = ", ".join(f"{n} {k}" for k, n in counts.items())
    return text + (f" ({probes})" if probes else "")


def _markdown(plan: AdoptPlan, refused: set[int], written: int | None) -> str:
    lines = ["## Adopt contractgen's generated true-on-policy package", ""]
    targets = sorted({c.target for c in plan.changes})
    lines.append(
        "Replaces the hand-kept true-on-policy modules of "
        + ", ".join(f"`{t}`" for t in targets)
        + " with the ones `contractgen sync` generates, after a name-by-name and value-by-value "
        "comparison of both versions (`contractgen adopt`)."
    )
    lines += ["", f"**Summary:** {_summary(plan)}.", ""]
    if refused:
        lines += ["### Refused (nothing written until allowed or fixed)", ""]
        lines += [f"- {_line(c, refused).strip()}" for c in plan.changes if id(c) in refused]
        lines.append("")
    sections = (
        ("Files", ("file",)),
        ("Contracts implemented", ("contracts",)),
        ("Removed names, fields and parameters", ("dropped",)),
        ("Changed values and errors", ("value", "error", "changed")),
        ("Changed fields and parameters", ("field", "param")),
        ("Added names", ("added",)),
    )
    for title, kinds in sections:
        rows = [c for c in plan.changes if c.kind in kinds and id(c) not in refused]
        if rows:
            lines += [f"### {title}", ""]
            lines += [f"- {_line(c, refused).strip()}" for c in rows]
            lines.append("")
    if plan.notes:
        lines += ["### Notes", "", *(f"- {n}" for n in plan.notes), ""]
    if written is not None:
        lines += [f"{written} file(s) written.", ""]
    return "\n".join(lines)


def _report(plan: AdoptPlan, refused: set[int], written: int | None, fmt: str) -> None:
    """Every change and note, in ``fmt`` (the verdict lines follow in ``command``)."""
    if fmt == "json":
        report = {
            "ok": not refused,
            "written": written,
            "changes": [dict(c.to_json(), refused=id(c) in refused) for c in plan.changes],
            "probes": {t: {"run": r, "differ": d} for t, (r, d) in plan.probes.items()},
            "notes": plan.notes,
        }
        click.echo(json.dumps(report, indent=2))
    elif fmt == "markdown":
        click.echo(_markdown(plan, refused, written))
    else:
        for c in plan.changes:
            click.echo(_line(c, refused))
        for note in plan.notes:
            click.echo(f"note: {note}")


@click.command("adopt")
@click.option(
    "--repo", "repos", multiple=True, required=True, metavar="NAME=PATH",
    help="Sibling repo whose hand-kept package to take over (NAME: a target, e.g. sglang, megatron, fsdp, launcher, or a repo, e.g. miles, for all its targets).",
)  # fmt: skip
@click.option(
    "--allow-drop", "allow", multiple=True, metavar="NAME",
    help="A public name, field or parameter the generated package may drop (repeat for several).",
)  # fmt: skip
@click.option(
    "--allow-change", "allow_change", multiple=True, metavar="NAME",
    help="A public name whose probed values, errors, fields or parameters may change (repeat).",
)  # fmt: skip
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text",
    show_default=True, help="text for people, json for tools, markdown for a PR description.",
)  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Report the changes; write nothing.")
@click.option(
    "--force", is_flag=True,
    help="Replace vendored files contractgen stamped that were edited by hand (as sync --force).",
)  # fmt: skip
@click.option(
    "--allow-new-package", is_flag=True,
    help="Where a repo has no package for a target, write a complete new one (nothing in the repo imports it yet); without it such a target is skipped.",
)  # fmt: skip
@click.pass_context
@handle_errors
def command(
    ctx: click.Context,
    repos: tuple[str, ...],
    allow: tuple[str, ...],
    allow_change: tuple[str, ...],
    fmt: str,
    dry_run: bool,
    force: bool,
    allow_new_package: bool,
) -> None:
    """Replace a hand-kept vendored package with the generated one, after a review-grade diff.

    Reports, name by name, what each replaced file gains (+), changes (~) or drops (-): fields,
    parameters, constants, error types and messages, and the results of the public functions
    over a probe grid (both versions imported), each difference one line, never cut. Exit 1,
    nothing written, when it would drop a name, field or parameter (unless --allow-drop NAME),
    change a probed value, error or signature (unless --allow-change NAME), write beside the
    package the repo really uses, or vendor a contract set contractgen.toml does not declare.
    Like sync, it refuses (exit 1, nothing written) to replace a file contractgen stamped that was
    edited by hand or holds merge-conflict markers, listing the changed lines, unless --force.
    """
    project = project_from(ctx)
    targets = parse_repo_options(repos, project.config)
    for target, path in targets:
        if not path.is_dir():
            fail(f"error: --repo {target}={path}: not a directory")
    plan = AdoptPlan()
    ids = [lc.id for lc in project.contracts]
    for target, path in targets:
        try:
            one = plan_adopt(project.vendored, target, path, project.config, ids, allow_new_package)
        except ValueError as exc:
            fail(f"error: {exc}")
        plan.changes += one.changes
        plan.probes.update(one.probes)
        plan.notes += one.notes
        plan.new_packages += one.new_packages
        plan.skipped += one.skipped
    vendored = dict(project.vendored)
    for target in plan.new_packages:  # a complete package: an __init__.py the repo then owns
        vendored[f"{target}/{project.config.package(target)}/__init__.py"] = NEW_PACKAGE_INIT
    targets = [(t, path) for t, path in targets if t not in plan.skipped]
    refused_list = plan.refused(set(allow), set(allow_change))
    refused = {id(c) for c in refused_list}
    written = None
    # sync's own plan, always: a stamped file edited by hand, an unwritable folder, a symlink out
    sync_plan, files = sync(vendored, targets, project.config, force=force,
                            dry_run=dry_run or bool(refused_list), hand_kept_ok=True)  # fmt: skip
    if sync_plan.refused:
        for f in sync_plan.refused:
            click.echo(f"refused: {f.problem}", err=True)
        click.echo("adopt: nothing written", err=True)
        sys.exit(EXIT_DRIFT)
    if not refused_list and not dry_run:
        written = len(files)
    _report(plan, refused, written, fmt)
    if refused_list and fmt == "text":
        click.echo(f"adopt: {_summary(plan)}; nothing written")
    if refused_list:
        names = ", ".join(sorted({c.name.split("(", 1)[0] for c in refused_list}))
        click.echo(
            f"adopt: refused ({len(refused_list)} change(s): {names}); allow each with "
            "--allow-drop NAME / --allow-change NAME, or fix contractgen.toml (nothing written)",
            err=True,
        )
        sys.exit(EXIT_DRIFT)
    if fmt == "text":
        done = "nothing written" if dry_run else f"{written} file(s) written"
        click.echo(f"adopt{' --dry-run' if dry_run else ''}: {_summary(plan)}; {done}")
    sys.exit(EXIT_OK)
