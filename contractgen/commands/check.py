"""``contractgen check``: is generated/ fresh, and are vendored copies byte-identical."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..codegen.config import ConfigError
from ..codegen.drift import (
    check_generated,
    check_repo,
    check_siblings,
    conflict_lines,
    extra_files,
    target_files,
)
from ..codegen.writer import UnsafePathError
from ..schema.errors import ContractError
from ._common import (
    EXIT_DRIFT,
    EXIT_OK,
    EXIT_USAGE,
    absent_packages,
    fail,
    handle_errors,
    parse_repo_options,
    project_from,
)


def _errors_as_json(exc: Exception) -> list[dict]:
    if isinstance(exc, ContractError):
        return [
            {"file": p.file, "line": p.line, "col": p.col, "field": p.path, "message": p.message}
            for p in exc.problems
        ]
    return [{"message": str(exc)}]


def _conflict_note(root: Path | None, rel: str) -> str:
    """ " (merge-conflict markers at line …; resolve the conflict)" when the file holds them."""
    path = None if root is None else root / rel
    if path is None or not path.is_file():
        return ""
    lines = conflict_lines(path.read_bytes())
    if not lines:
        return ""
    where = ", ".join(str(n) for n in lines[:6])
    return f" (merge-conflict markers at line {where}: resolve the conflict, then regenerate)"


def _print_report(
    roots: dict[str, Path],
    drift: list,
    own: dict[str, list[str]],
    absent: list[str],
    files: int,
    checked: int,
) -> None:
    """The human report: each drifted file with its diff (``roots``: where each side lies), a
    note per package a repo does not hold (``absent``), one per repo's own modules, and the
    one-line verdict (on stderr when something differs)."""
    for d in drift:
        if d.kind == "orphaned":  # its whole body as a deletion diff says nothing more
            click.echo(f"orphaned (remove it): {d.path}")
            continue
        click.echo(f"{d.kind}: {d.path}{_conflict_note(roots.get(d.where), d.rel)}")
        if d.diff:
            click.echo(d.diff, nl=not d.diff.endswith("\n"))
    for note in absent:
        click.echo(f"note: {note}")
    for label, rels in own.items():  # one line per repo, not one per module
        click.echo(
            f"note: {label}: {len(rels)} module(s) of the repo's own beside the vendored "
            "ones, left alone (--json lists them)"
        )
    if drift:
        click.echo(
            f"check: {len(drift)} file(s) differ; run `contractgen generate` for generated/ "
            "and `contractgen sync --repo NAME=PATH` for sibling repos",
            err=True,
        )
    else:
        click.echo(f"check: ok ({files} files, {checked} location(s))")


@click.command("check")
@click.option(
    "--repo", "repos", multiple=True, metavar="NAME=PATH",
    help="Also check the vendored copy in a sibling repo (NAME: a target, e.g. sglang, megatron, fsdp, launcher, or a repo, e.g. miles, for all its targets).",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report instead of text.")
@click.option(
    "--require-repo", is_flag=True, hidden=True,
    help="Fail without --repo (the contractgen-check pre-commit hook: a sibling repo's copy).",
)  # fmt: skip
@click.pass_context
@handle_errors
def command(
    ctx: click.Context, repos: tuple[str, ...], as_json: bool, require_repo: bool = False
) -> None:
    """Exit 0 when generated/ (and every --repo) matches what the contracts render, else 1.

    Reports stale, missing and orphaned files with a unified diff, temp files an interrupted
    sync or generate left behind, and sibling repos whose schema.py copies disagree on a contract
    both carry. A vendored copy is compared with what its target renders (only the contracts it
    implements), up to formatting: a formatter run over it (black, ruff-format, isort) is not
    drift. The repo's own modules in a vendored package are counted in one note and left alone.
    """
    if require_repo and not repos:
        fail(
            "error: contractgen-check needs the repo to check: add args: [--repo, NAME=.] to the "
            "hook in .pre-commit-config.yaml (NAME: sglang, Megatron-LM or miles); without it "
            "only contractgen's own generated/ would be checked"
        )
    try:  # NAME is looked up in the project's target registry (its plugins included)
        names = project_from(ctx).config
    except (ContractError, ConfigError, UnsafePathError):
        names = None  # reported below, where the project is opened for the check
    targets = parse_repo_options(repos, names)
    for target, path in targets:
        if not path.is_dir():
            message = f"--repo {target}={path}: not a directory"
            if as_json:
                click.echo(json.dumps({"ok": False, "errors": [{"message": message}]}, indent=2))
                sys.exit(EXIT_USAGE)
            fail(f"error: {message}")
    try:
        project = project_from(ctx)
        rendered = project.rendered
        drift = check_generated(rendered, project.config)
        notes: list[str] = []
        own: dict[str, list[str]] = {}  # "target:path" -> the repo's own modules in the package
        absent = absent_packages(repos, targets, project.config)
        targets = [pair for pair in targets if pair not in absent]
        for target, path in targets:
            drift += check_repo(project.vendored, target, path, project.config)
            files = target_files(project.vendored, target, project.config)
            label = f"{target}:{path.as_posix()}"
            for rel in extra_files(files, path, project.config.package(target))[1]:
                notes.append(f"{label}/{rel}")
                own.setdefault(label, []).append(rel)
        drift += check_siblings(targets, project.config, project.vendored)
    except (ContractError, ConfigError, UnsafePathError) as exc:
        if not as_json:
            raise
        click.echo(json.dumps({"ok": False, "errors": _errors_as_json(exc)}, indent=2))
        sys.exit(EXIT_USAGE)
    if as_json:
        report = {
            "ok": not drift,
            "contracts": [lc.id for lc in project.contracts],
            "implemented": {t: list(project.implemented(t)) for t, _ in targets},
            "files": len(rendered),
            "drift": [d.to_json() for d in drift],
            "not_generated": notes,
            "not_checked": [f"{t}:{p.as_posix()}" for t, p in absent],  # no package there
        }
        click.echo(json.dumps(report, indent=2))
    else:
        roots = {"generated": project.config.generated_dir, **dict(targets)}
        absent_notes = [
            f"{target}:{path.as_posix()}: no {project.config.package(target)}/ in this repo, not "
            f"checked (--repo {target}=PATH requires it)"
            for target, path in absent
        ]
        _print_report(roots, drift, own, absent_notes, files=len(rendered), checked=1 + len(repos))
    sys.exit(EXIT_DRIFT if drift else EXIT_OK)
