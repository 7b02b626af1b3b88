"""Read the old side of ``contractgen breaking``: contracts at a git ref, or in a directory.

A git ref is read from the git repository holding the project root (``git ls-tree`` and
``git cat-file`` of the contracts directory at that commit, never a checkout), and validated with
the current schema exactly as the working tree is. The generated modules committed at the ref are
read too, so public names dropped by a template change are caught. A directory is either a
contracts directory or a project root with a ``contractgen.toml``.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from ...schema.errors import ContractError
from ...schema.loader import LoadedContract, load_contracts
from ..config import ProjectConfig, load_config
from ..render import FILES


class BaselineError(ValueError):
    """``--against`` names neither a directory nor a git ref; the message says what to pass."""


@dataclass(frozen=True)
class Baseline:
    label: str  # what --against named
    kind: str  # "git" | "directory"
    contracts: list[LoadedContract]
    files: dict[str, str]  # contract id -> display path
    generated: dict[tuple[str, str], bytes] = field(default_factory=dict)
    git_root: Path | None = None  # top level of the project's git repo, when there is one


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False)


def git_toplevel(path: Path) -> Path | None:
    """Top level of the git work tree holding ``path``, or None."""
    try:
        proc = _git(path, "rev-parse", "--show-toplevel")
    except (FileNotFoundError, NotADirectoryError):
        return None
    if proc.returncode != 0:
        return None
    return Path(proc.stdout.decode().strip())


def _relative(path: Path, base: Path) -> str | None:
    try:
        return path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return None


def _display(path: Path, root: Path) -> str:
    return _relative(path, root) or path.as_posix()


def _blobs(top: Path, commit: str, directory: str) -> dict[str, str]:
    """``{file name: blob sha}`` of the entries directly inside ``directory`` at ``commit``."""
    spec = f"{directory}/" if directory not in ("", ".") else "."
    proc = _git(top, "ls-tree", "-z", commit, "--", spec)
    out = {}
    for entry in proc.stdout.decode().split("\0"):
        if not entry:
            continue
        meta, _, path = entry.partition("\t")
        mode, kind, sha = meta.split()
        if kind == "blob":
            out[PurePosixPath(path).name] = sha
    return out


def _blob(top: Path, commit: str, path: str) -> bytes | None:
    proc = _git(top, "cat-file", "blob", f"{commit}:{path}")
    return proc.stdout if proc.returncode == 0 else None


def _load_git(against: str, config: ProjectConfig) -> Baseline:
    top = git_toplevel(config.root)
    if top is None:
        raise BaselineError(
            f"--against {against!r}: not a directory, and {config.root} is not in a git "
            "repository; pass a git ref of the project's repository or a directory of contracts"
        )
    proc = _git(top, "rev-parse", "--verify", "--quiet", f"{against}^{{commit}}")
    if proc.returncode != 0 or against.startswith("-"):
        raise BaselineError(
            f"--against {against!r}: not a directory and not a git ref of {top} "
            "(try main, a tag, HEAD~1, or a directory of contracts)"
        )
    commit = proc.stdout.decode().strip()
    rel = _relative(config.contracts_dir, top)
    if rel is None:
        raise BaselineError(
            f"--against {against!r}: the contracts directory {config.contracts_dir} is outside "
            f"the git repository {top}; pass --against a directory of contracts instead"
        )
    shown_dir = _relative(config.contracts_dir, config.root) or rel
    blobs = {n: s for n, s in _blobs(top, commit, rel).items() if n.endswith(".yaml")}
    contracts: list[LoadedContract] = []
    files: dict[str, str] = {}
    if blobs:
        with tempfile.TemporaryDirectory(prefix="contractgen-breaking-") as tmp:
            folder = Path(tmp).joinpath(*PurePosixPath(shown_dir).parts)
            folder.mkdir(parents=True, exist_ok=True)
            for name, sha in blobs.items():
                content = _git(top, "cat-file", "blob", sha).stdout
                (folder / name).write_bytes(content)
            try:
                contracts = load_contracts(folder, Path(tmp))
            except ContractError as exc:
                raise ContractError(
                    [replace(p, file=f"{against}:{_strip(p.file, tmp)}") for p in exc.problems]
                ) from None
            files = {lc.id: _display(config.contracts_dir / lc.path.name, config.root)
                     for lc in contracts}  # fmt: skip
    generated = {}
    gen_rel = _relative(config.generated_dir, top)
    if gen_rel is not None:
        for target in sorted(config.targets):
            for name in FILES:
                path = PurePosixPath(gen_rel, target, config.package(target), name).as_posix()
                content = _blob(top, commit, path)
                if content is not None:
                    generated[(target, name)] = content
    return Baseline(against, "git", contracts, files, generated, top)


def _strip(file: str, tmp: str) -> str:
    """A problem's file shown relative to the ref, never the temporary folder."""
    prefix = Path(tmp).as_posix().rstrip("/") + "/"
    return file[len(prefix) :] if file.startswith(prefix) else file


def _load_directory(directory: Path, config: ProjectConfig) -> Baseline:
    generated = {}
    if (directory / "contractgen.toml").is_file():
        other = load_config(directory)
        contracts_dir = other.contracts_dir
        for target in sorted(other.targets):
            for name in FILES:
                path = other.generated_dir / target / other.package(target) / name
                if path.is_file():
                    generated[(target, name)] = path.read_bytes()
    else:
        contracts_dir = directory
    contracts = load_contracts(contracts_dir, config.root)
    # where each file lives in this project (a removed one is restored there)
    files = {lc.id: _display(config.contracts_dir / lc.path.name, config.root) for lc in contracts}
    return Baseline(str(directory), "directory", contracts, files, generated,
                    git_toplevel(config.root))  # fmt: skip


def load_baseline(against: str, config: ProjectConfig) -> Baseline:
    """The old side named by ``--against``: an existing directory wins over a git ref."""
    if not against:
        raise BaselineError("--against needs a git ref (main, a tag, HEAD~1) or a directory")
    directory = Path(against)
    if directory.is_dir():
        return _load_directory(directory, config)
    return _load_git(against, config)
