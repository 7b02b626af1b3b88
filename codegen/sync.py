"""Copy rendered files into sibling repositories, safely.

Every repo is planned before anything is written: a destination outside the vendored package, a
symlink that leaves the repo, or a vendored file edited by hand (its body no longer matches the
sha256 in its own header) stops the whole sync unless ``force`` is given for the hand edit.
Planning and writing both happen while an exclusive lock on every repo is held, and writes go
through a temp file and ``os.replace``.
"""

from __future__ import annotations

import difflib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from .config import ProjectConfig
from .drift import (
    conflict_lines,
    extra_files,
    leftover_temp_files,
    target_files,
    unified_diff,
)
from .fingerprint import is_hand_edited, read_stamp, same_generated
from .locate import MissingAnchorError, WrongRepoError, misplaced, missing_anchor, wrong_repo
from .writer import UnsafePathError, atomic_write, safe_destination


class SyncRefused(RuntimeError):
    """A sync would overwrite something it must not; nothing was written."""


class SyncWriteError(OSError):
    """A write failed mid-sync; every file written before it was put back (one line)."""


MAX_SHOWN = 8  # changed lines listed per refused file


def changed_lines(current: bytes, content: bytes) -> str:
    """The lines a hand edit changed (``- on disk`` / ``+ generated``), at most MAX_SHOWN each."""
    old = current.decode("utf-8", "replace").splitlines()
    new = content.decode("utf-8", "replace").splitlines()
    minus, plus = [], []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(
        None, old, new, autojunk=False
    ).get_opcodes():
        if tag != "equal":
            minus += [ln.strip() or "(a blank line)" for ln in old[i1:i2]]
            plus += [ln.strip() or "(a blank line)" for ln in new[j1:j2]]
    shown = [f"    - {ln}" for ln in minus[:MAX_SHOWN]] + [f"    + {ln}" for ln in plus[:MAX_SHOWN]]
    more = max(len(minus), len(plus)) - MAX_SHOWN
    if more > 0:
        shown.append(f"    … {more} more changed line(s) (sync --dry-run shows the whole diff)")
    return "\n".join(shown)


def edit_problem(dest: Path, current: bytes, content: bytes) -> str:
    """Why a stamped file whose body no longer matches its stamp must not be replaced."""
    markers = conflict_lines(current)
    if markers:
        where = ", ".join(str(n) for n in markers[:6])
        return (
            f"{dest}: holds merge-conflict markers (line {where}) and does not parse; resolve the "
            "conflict (or re-run `contractgen sync` after `git checkout` of the file), or use --force"
        )
    ours, theirs = read_stamp(content), read_stamp(current)  # the bodies: headers differ anyway
    values = changed_lines(theirs.body if theirs else current, ours.body if ours else content)
    return (
        f"{dest}: edited by hand (its content no longer matches the sha256 in its header); move "
        "the change into the contract or template, or use --force. Changed (on disk -> generated):"
        + (f"\n{values}" if values else " only the stamp")
    )


def writable_problem(dest: Path) -> str:
    """Why ``dest`` cannot be written ('' when it can): its folder (or the nearest one that
    exists) must be a writable directory, since writes go through a temp file beside it."""
    folder = dest.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder}: not a directory, so {dest} cannot be written"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder}: not writable (permission denied), so {dest} cannot be written; fix its permissions"
    return ""


@dataclass
class FilePlan:
    target: str
    repo: Path
    rel: str
    dest: Path
    content: bytes
    action: str  # "create" | "update" | "unchanged" | "remove"
    diff: str = ""
    problem: str = ""  # why it is refused, when it is


@dataclass
class SyncPlan:
    files: list[FilePlan] = field(default_factory=list)

    @property
    def refused(self) -> list[FilePlan]:
        return [f for f in self.files if f.problem]

    @property
    def changes(self) -> list[FilePlan]:
        return [f for f in self.files if f.action != "unchanged"]


def plan_sync(
    rendered: dict[str, bytes],
    repos: list[tuple[str, Path]],
    config: ProjectConfig,
    force: bool = False,
    hand_kept_ok: bool = False,
) -> SyncPlan:
    """What a sync would do, file by file; raises UnsafePathError for escaping destinations and
    MissingAnchorError (one line per target) when a package's anchor is not in its repo.

    ``hand_kept_ok`` (adopt, after its name-by-name review): files contractgen never stamped may
    be replaced; a stamped file edited by hand is still refused unless ``force``. Every write is
    checked for writability here, so a folder that cannot be written stops the whole sync."""
    plan = SyncPlan()
    no_anchor = []
    for target, repo in repos:
        if not repo.is_dir():
            raise FileNotFoundError(f"--repo {target}={repo}: not a directory")
        package = config.package(target)
        check_repo_is_right(repo, target, config)
        files = target_files(rendered, target, config)
        elsewhere = misplaced(repo, target, package, sibling_packages(target, config))
        if elsewhere:  # never a silent write beside the package the repo really uses
            plan.files.append(FilePlan(target, repo, package, repo / package, b"", "create",
                                       problem=elsewhere))  # fmt: skip
            continue
        missing = missing_anchor(repo, target, package, config.targets[target].repo)
        if missing:  # never a package where the repo has none of the target's code
            no_anchor.append(missing)
            continue
        stamped, _ = extra_files(files, repo, package)
        for rel in [*leftover_temp_files(files, repo), *stamped]:
            dest = safe_destination(repo, rel)
            current = dest.read_bytes()
            problem = ""
            if rel in stamped and is_hand_edited(current) and not force:
                problem = (
                    f"{dest}: no contract produces it any more, and it was edited by hand; "
                    "remove it yourself or use --force"
                )
            plan.files.append(FilePlan(target, repo, rel, dest, b"", "remove",
                                       unified_diff(current, b"", f"{target}:{rel}"), problem))  # fmt: skip
        for rel, content in sorted(files.items()):
            if not rel.startswith(package + "/"):
                raise UnsafePathError(f"{rel}: outside the vendored package {package}")
            dest = safe_destination(repo, rel)
            shown = f"{target}:{rel}"
            if not dest.exists():
                plan.files.append(FilePlan(target, repo, rel, dest, content, "create",
                                           unified_diff(b"", content, shown)))  # fmt: skip
                continue
            if dest.is_dir() or dest.is_symlink():
                plan.files.append(FilePlan(target, repo, rel, dest, content, "update",
                                           problem=f"{dest} is a directory or symlink"))  # fmt: skip
                continue
            current = dest.read_bytes()
            if same_generated(current, content):  # identical, or only reformatted by the repo
                plan.files.append(FilePlan(target, repo, rel, dest, content, "unchanged"))
                continue
            edited = is_hand_edited(current)
            problem = ""
            if edited is None and not (force or hand_kept_ok):
                problem = f"{dest}: exists and was not generated by contractgen (use --force to replace it)"
            elif edited and not force:
                problem = edit_problem(dest, current, content)
            plan.files.append(
                FilePlan(target, repo, rel, dest, content, "update",
                         unified_diff(current, content, shown), problem)
            )  # fmt: skip
    if no_anchor:
        raise MissingAnchorError("\n".join(no_anchor))
    for f in plan.changes:
        if not f.problem:
            f.problem = writable_problem(f.dest)
    return plan


def check_repo_is_right(repo: Path, target: str, config: ProjectConfig) -> None:
    """Raise WrongRepoError when ``repo`` holds another repo's target package, not ``target``'s."""
    mine = config.targets[target].repo
    others = {t: config.package(t) for t in config.targets if config.targets[t].repo != mine}
    problem = wrong_repo(repo, target, config.package(target), others)
    if problem:
        raise WrongRepoError(problem)


def sibling_packages(target: str, config: ProjectConfig) -> frozenset[str]:
    """The packages the other targets of ``target``'s repo write (miles: fsdp's and launcher's)."""
    repo = config.targets[target].repo
    return frozenset(
        config.package(t.name) for t in config.targets.values()
        if t.repo == repo and t.name != target
    )  # fmt: skip


@contextmanager
def repo_lock(repo: Path) -> Iterator[None]:
    """Exclusive lock per repo, held outside the repo so nothing is written beside its files."""
    key = hashlib.sha256(str(repo.resolve()).encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"contractgen-sync-{key}.lock"
    while True:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:  # the holder before us may have removed the file: then lock the new one
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)  # removed while still held: no lock file is left behind
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextmanager
def repos_locked(repos: list[tuple[str, Path]]) -> Iterator[None]:
    """Hold every repo's lock (in one global order, so two syncs cannot deadlock)."""
    with ExitStack() as stack:
        for repo in sorted({r.resolve() for _, r in repos if r.is_dir()}):
            stack.enter_context(repo_lock(repo))
        yield


def apply_sync(plan: SyncPlan) -> list[FilePlan]:
    """Write every change of a plan with no refusals; returns the files written.

    Call it under ``repos_locked`` with the plan made under the same lock, so no other sync can
    change a file between the check and the write.
    """
    if plan.refused:
        raise SyncRefused("\n".join(f.problem for f in plan.refused))
    written: list[FilePlan] = []
    before: list[tuple[Path, bytes | None]] = []  # what to put back, in write order
    made: list[Path] = []  # folders this sync created
    try:
        for f in plan.changes:
            before.append((f.dest, f.dest.read_bytes() if f.dest.is_file() else None))
            if f.action == "remove":
                f.dest.unlink(missing_ok=True)
            else:
                made += _missing_folders(f.dest.parent)
                atomic_write(f.dest, f.content)
            written.append(f)
    except BaseException as exc:
        _roll_back(before, made)
        if isinstance(exc, OSError):
            raise SyncWriteError(
                f"{exc.filename or plan.changes[len(written)].dest}: {exc.strerror or exc}; "
                f"the {len(written)} file(s) written before it were put back, nothing changed"
            ) from None
        raise  # an interrupt: rolled back, reported by the command line
    return written


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its parents that do not exist yet, outermost first."""
    out = []
    while not folder.exists() and folder != folder.parent:
        out.append(folder)
        folder = folder.parent
    return out[::-1]


def _roll_back(before: list[tuple[Path, bytes | None]], made: list[Path]) -> None:
    """Put every file back as it was, newest first, then remove the folders this sync made."""
    for dest, content in reversed(before):
        try:
            if content is None:
                dest.unlink(missing_ok=True)
            else:
                atomic_write(dest, content)
        except OSError:
            pass  # best effort: the error that started the roll-back is the one reported
    for folder in reversed(made):
        try:
            folder.rmdir()
        except OSError:
            pass


def sync(
    rendered: dict[str, bytes],
    repos: list[tuple[str, Path]],
    config: ProjectConfig,
    force: bool = False,
    dry_run: bool = False,
    hand_kept_ok: bool = False,
) -> tuple[SyncPlan, list[FilePlan]]:
    """Plan and (unless ``dry_run`` or refused) write, all under the repos' locks."""
    with repos_locked(repos):
        plan = plan_sync(rendered, repos, config, force=force, hand_kept_ok=hand_kept_ok)
        if dry_run or plan.refused:
            return plan, []
        return plan, apply_sync(plan)
