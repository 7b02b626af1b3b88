"""Compare the rendered map with files on disk: stale, missing and orphaned files, with diffs."""

from __future__ import annotations

import difflib
import re
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from .config import ProjectConfig
from .generated_dir import check_generated_dir
from .targets import registry
from .writer import UnsafePathError, safe_destination


@dataclass(frozen=True)
class Drift:
    """One file that differs from what ``render()`` produces."""

    kind: str  # "stale" | "missing" | "orphaned" | "leftover" (an interrupted write's temp file)
    where: str  # "generated" or the target name of a sibling repo
    path: str  # path shown to the user
    rel: str  # path relative to the compared root (generated/ or the sibling repo)
    diff: str = ""

    def to_json(self) -> dict:
        return asdict(self)


CONFLICT_MARKERS = (b"<<<<<<< ", b"=======", b">>>>>>> ")


def conflict_lines(content: bytes) -> list[int]:
    """1-based lines holding merge-conflict markers (``<<<<<<<``, ``=======``, ``>>>>>>>``)."""
    return [
        n for n, line in enumerate(content.splitlines(), 1)
        if line.startswith(CONFLICT_MARKERS) or line.rstrip() == b"======="
    ]  # fmt: skip


def unified_diff(old: bytes, new: bytes, path: str) -> str:
    a = old.decode("utf-8", errors="replace").splitlines(keepends=True)
    b = new.decode("utf-8", errors="replace").splitlines(keepends=True)
    lines = difflib.unified_diff(a, b, f"{path} (on disk)", f"{path} (rendered)")
    # as diff(1) does: a last line without a newline is marked, so every line ends in one
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines
    )


def _compare(
    expected: dict[str, bytes], root: Path, where: str, shown: str, formatted_ok: bool = False
) -> list[Drift]:
    """Missing and stale files; ``formatted_ok``: a vendored copy a formatter ran over (its body's
    canonical form unchanged, see ``fingerprint.same_generated``) is not stale."""
    from .fingerprint import same_generated

    found: list[Drift] = []
    for rel, content in expected.items():
        path = root / rel
        label = f"{shown}/{rel}"
        if not path.is_file():
            found.append(Drift("missing", where, label, rel, unified_diff(b"", content, label)))
            continue
        actual = path.read_bytes()
        if actual == content or (formatted_ok and same_generated(actual, content)):
            continue
        found.append(Drift("stale", where, label, rel, unified_diff(actual, content, label)))
    return found


# atomic_write's temp files: ``.<name>.<random>.tmp`` beside ``<name>``
_TEMP = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]+\.tmp$")


def leftover_temp_files(expected: dict[str, bytes], root: Path) -> list[str]:
    """Temp files an interrupted write (``kill -9``) left beside the files of ``expected``."""
    found = []
    for folder in sorted({PurePosixPath(rel).parent for rel in expected}):
        here = root.joinpath(*folder.parts)
        if not here.is_dir() or here.is_symlink():
            continue
        for path in sorted(here.iterdir()):
            match = _TEMP.match(path.name)
            if match and (folder / match["name"]).as_posix() in expected and path.is_file():
                found.append((folder / path.name).as_posix())
    return found


def extra_files(
    expected: dict[str, bytes], root: Path, package: str
) -> tuple[list[str], list[str]]:
    """Files in a vendored package that no contract produces: (stamped by contractgen, others).

    A stamped one is an orphan of an earlier generation; an unstamped one is the repo's own
    (miles keeps config.py and model_profiles.py beside the vendored modules) and is left alone.
    """
    from .fingerprint import split_generated

    here = root.joinpath(*PurePosixPath(package).parts)
    stamped, others = [], []
    if not here.is_dir() or here.is_symlink():
        return stamped, others
    for path in sorted(here.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if "__pycache__" in path.parts or not path.is_file() or rel in expected:
            continue
        if (
            _TEMP.match(path.name)
            and (PurePosixPath(rel).parent / _TEMP.match(path.name)["name"]).as_posix() in expected
        ):
            continue  # reported as leftover
        head = path.read_bytes()[:65536]
        (stamped if split_generated(head) is not None else others).append(rel)
    return stamped, others


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
                if not _TEMP.match(path.name):
                    found.append(Drift("orphaned", "generated", label, rel, diff))
        for rel in leftover_temp_files(rendered, gen):
            found.append(Drift("leftover", "generated", f"{shown}/{rel}", rel))
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
    shown = f"{target}:{repo.as_posix()}"
    found = _compare(files, repo, target, shown, formatted_ok=True)
    stamped, _ = extra_files(files, repo, config.package(target))
    for rel in stamped:
        diff = unified_diff((repo / rel).read_bytes(), b"", f"{shown}/{rel}")
        found.append(Drift("orphaned", target, f"{shown}/{rel}", rel, diff))
    for rel in leftover_temp_files(files, repo):
        found.append(Drift("leftover", target, f"{shown}/{rel}", rel))
    return found


# The one vendored file meant to be identical in every sibling repo (with the same contracts).
SHARED_FILE = "schema.py"


def _fingerprints(content: bytes) -> dict[str, str]:
    import ast

    try:
        for node in ast.parse(content).body:
            target = node.target if isinstance(node, ast.AnnAssign) else (
                node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
            )  # fmt: skip
            if isinstance(target, ast.Name) and target.id == "FINGERPRINTS" and node.value:
                return dict(ast.literal_eval(node.value))
    except (SyntaxError, ValueError):
        pass
    return {}


def check_siblings(
    repos: list[tuple[str, Path]],
    config: ProjectConfig,
    vendored: dict[str, bytes] | None = None,
) -> list[Drift]:
    """Sibling repos' copies of the shared ``schema.py`` compared with each other.

    Independent of what the contracts render now: two copies meant to be the same (the same
    contracts) that differ in any byte are named with the diff between them; two repos that implement
    different contracts must agree on the fingerprint of every contract both carry.
    """
    copies = []
    for target, repo in repos:
        rel = f"{config.package(target)}/{SHARED_FILE}"
        path = safe_destination(repo, rel)
        if path.is_file():
            copies.append((target, repo, rel, path.read_bytes()))
    expected = {t: (vendored or {}).get(f"{t}/{config.package(t)}/{SHARED_FILE}") for t, _ in repos}
    found = []
    for i, (t1, r1, rel1, c1) in enumerate(copies):
        for t2, r2, rel2, c2 in copies[i + 1 :]:
            if c1 == c2:  # byte-identical copies, nothing else
                continue
            a, b = f"{t1}:{r1.as_posix()}/{rel1}", f"{t2}:{r2.as_posix()}/{rel2}"
            e1, e2 = expected.get(t1), expected.get(t2)
            if e1 is not None and e2 is not None and e1 != e2:
                # different contract sets by design: only the contracts both carry must agree
                f1, f2 = _fingerprints(c1), _fingerprints(c2)
                differ = sorted(cid for cid in set(f1) & set(f2) if f1[cid] != f2[cid])
                if not differ:
                    continue
                diff = "".join(f"  {cid}: {f1[cid]} != {f2[cid]}\n" for cid in differ)
                found.append(Drift("sibling", f"{t1}/{t2}", f"{a} != {b}", rel2, diff))
                continue
            lines = difflib.unified_diff(
                c1.decode("utf-8", "replace").splitlines(keepends=True),
                c2.decode("utf-8", "replace").splitlines(keepends=True),
                a,
                b,
            )
            diff = "".join(x if x.endswith("\n") else x + "\n" for x in lines)
            found.append(Drift("sibling", f"{t1}/{t2}", f"{a} != {b}", rel2, diff))
    return found


def resolve_target_names(name: str, config: ProjectConfig | None = None) -> list[str]:
    """Accept a target name (sglang, megatron, launcher, fsdp, a plugin's): that target; or a
    repo name (Megatron-LM, miles): every target of that repo (miles: fsdp and launcher), from
    ``config``'s target registry (default: the active project's)."""
    targets = registry(config)
    if name in targets:
        return [name]
    found = [t.name for t in targets.values() if t.repo.lower() == name.lower()]
    if found:
        return found
    known = ", ".join(f"{t.name} (repo {t.repo})" for t in targets.values())
    raise KeyError(f"unknown repo name {name!r}; use one of: {known}")


__all__ = [
    "Drift",
    "UnsafePathError",
    "check_generated",
    "check_repo",
    "check_siblings",
    "extra_files",
    "leftover_temp_files",
    "target_files",
]
