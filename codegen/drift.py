"""Compare the rendered map with files on disk: stale, missing and orphaned files, with diffs."""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass
from pathlib import Path

from .config import ProjectConfig, check_generated_dir
from .targets import TARGETS
from .writer import UnsafePathError, safe_destination


@dataclass(frozen=True)
class Drift:
    """One file that differs from what ``render()`` produces."""

    kind: str  # "stale" | "missing" | "orphaned"
    where: str  # "generated" or the target name of a sibling repo
    path: str  # path shown to the user
    rel: str  # path relative to the compared root (generated/ or the sibling repo)
    diff: str = ""

    def to_json(self) -> dict:
        return asdict(self)


def unified_diff(old: bytes, new: bytes, path: str) -> str:
    a = old.decode("utf-8", errors="replace").splitlines(keepends=True)
    b = new.decode("utf-8", errors="replace").splitlines(keepends=True)
    lines = difflib.unified_diff(a, b, f"{path} (on disk)", f"{path} (rendered)")
    # as diff(1) does: a last line without a newline is marked, so every line ends in one
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


def _compare(expected: dict[str, bytes], root: Path, where: str, shown: str) -> list[Drift]:
    found: list[Drift] = []
    for rel, content in expected.items():
        path = root / rel
        label = f"{shown}/{rel}"
        if not path.is_file():
            found.append(Drift("missing", where, label, rel, unified_diff(b"", content, label)))
            continue
        actual = path.read_bytes()
        if actual != content:
            found.append(Drift("stale", where, label, rel, unified_diff(actual, content, label)))
    return found


def check_generated(rendered: dict[str, bytes], config: ProjectConfig) -> list[Drift]:
    """Drift between ``generated/`` and the rendered map, orphaned files included."""
    check_generated_dir(config, rendered, foreign=False)
    gen = config.generated_dir
    try:
        shown = gen.relative_to(config.root).as_posix()
    except ValueError:
        shown = gen.as_posix()
    found = _compare(rendered, gen, "generated", shown)
    if gen.is_dir():
        for path in sorted(p for p in gen.rglob("*") if p.is_file()):
            rel = path.relative_to(gen).as_posix()
            if rel not in rendered and "__pycache__" not in path.parts:
                label = f"{shown}/{rel}"
                diff = unified_diff(path.read_bytes(), b"", label)
                found.append(Drift("orphaned", "generated", label, rel, diff))
    return found


def target_files(
    rendered: dict[str, bytes], target: str, config: ProjectConfig
) -> dict[str, bytes]:
    """The rendered files of one target, keyed by their path inside the sibling repo."""
    prefix = f"{target}/"
    return {k[len(prefix) :]: v for k, v in rendered.items() if k.startswith(prefix)}


def check_repo(
    rendered: dict[str, bytes], target: str, repo: Path, config: ProjectConfig
) -> list[Drift]:
    """Drift between a sibling repo's vendored package and the rendered files of ``target``."""
    files = target_files(rendered, target, config)
    for rel in files:
        safe_destination(repo, rel)  # raises UnsafePathError for escaping paths
    return _compare(files, repo, target, f"{target}:{repo.as_posix()}")


def resolve_target_name(name: str) -> str:
    """Accept a target name (sglang, megatron, launcher) or its repo name (Megatron-LM, miles)."""
    if name in TARGETS:
        return name
    for target in TARGETS.values():
        if target.repo.lower() == name.lower():
            return target.name
    known = ", ".join(f"{t.name} (repo {t.repo})" for t in TARGETS.values())
    raise KeyError(f"unknown repo name {name!r}; use one of: {known}")


__all__ = ["Drift", "UnsafePathError", "check_generated", "check_repo", "target_files"]
