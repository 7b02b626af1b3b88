"""Compare two sets of validated contracts and their rendered modules: a pure function.

Contracts are compared by id on their validated data (``model_dump``), so comments, key order and
YAML style never count as changes; checkpoints are matched by name. Public names of the generated
modules are compared by rendering both sides with the same ``render()`` (and, on the old side, by
also reading the generated files committed at the baseline, so a template that drops a name is
caught too).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import yaml

from ...schema.loader import LoadedContract
from ..config import ProjectConfig
from ..render import render
from .rules import RULES, field_rule


class _Absent:
    """The side of a change where the value does not exist (added or removed)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()

CHECKPOINTS = ("model_profile", "checkpoints")
NUMERICS_FIX = (
    "{id} has shipped and its numerics never change: restore the old value and make the change "
    "in a new contract (contractgen new --from {newest} --id {next})"
)
REMOVED_FIX = (
    "a shipped id is never removed: restore {file}; to retire it, add a newer contract that "
    "supersedes it"
)
NAME_FIX = (
    "the sibling repos import the generated modules: keep every public name (restore the "
    "contract or template change that dropped it)"
)


@dataclass(frozen=True)
class Finding:
    """One change between the baseline and now, with the rule it falls under."""

    rule: str
    file: str  # display path (the new file when it exists)
    path: str  # dotted field path, or the public name
    contract: str | None = None
    old: object = ABSENT
    new: object = ABSENT
    line: int | None = None
    col: int | None = None
    fix: str = ""

    @property
    def breaking(self) -> bool:
        return RULES[self.rule].breaking

    def sort_key(self) -> tuple:
        return (not self.breaking, self.file, self.line or 0, self.path, self.rule)


@dataclass(frozen=True)
class Side:
    """One side of the comparison: validated contracts, their display paths, committed modules."""

    contracts: Sequence[LoadedContract]
    files: Mapping[str, str]  # contract id -> display path
    generated: Mapping[tuple[str, str], bytes] = field(default_factory=dict)  # (target, file)


# ---------------------------------------------------------------------------------------------
# Positions of fields in the new file, for file:line:col and GitHub annotations.


def positions(source: bytes) -> dict[tuple, tuple[int, int]]:
    """``{field path: (line, col)}`` of a YAML document, keys reported at the key (1-based)."""
    try:
        node = yaml.compose(source.decode("utf-8"), Loader=yaml.SafeLoader)
    except (yaml.YAMLError, UnicodeDecodeError):
        return {}
    marks: dict[tuple, tuple[int, int]] = {}

    def walk(n: yaml.Node, here: tuple) -> None:
        marks.setdefault(here, (n.start_mark.line + 1, n.start_mark.column + 1))
        if isinstance(n, yaml.MappingNode):
            for key, value in n.value:
                marks[here + (key.value,)] = (key.start_mark.line + 1, key.start_mark.column + 1)
                walk(value, here + (key.value,))
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                walk(item, here + (i,))

    if node is not None:
        walk(node, ())
    return marks


def _position(path: tuple, marks: Mapping[tuple, tuple[int, int]]) -> tuple[int | None, int | None]:
    for n in range(len(path), 0, -1):
        if path[:n] in marks:
            return marks[path[:n]]
    return (None, None)


# ---------------------------------------------------------------------------------------------
# Contract data.


def _canon(value: object) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _diff(old: object, new: object, here: tuple) -> Iterator[tuple[tuple, object, object]]:
    """Leaf differences between two JSON values; dicts recurse, anything else compares whole."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in [*old, *(k for k in new if k not in old)]:
            yield from _diff(old.get(key, ABSENT), new.get(key, ABSENT), here + (key,))
    elif old is ABSENT or new is ABSENT or _canon(old) != _canon(new):
        yield here, old, new


def _dotted(path: Sequence) -> str:
    return ".".join(str(p) for p in path)


def _by_name(checkpoints: list[dict]) -> dict[str, tuple[int, dict]]:
    out: dict[str, tuple[int, dict]] = {}
    for i, dims in enumerate(checkpoints):
        name = dims["name"]
        key, n = name, 1
        while key in out:  # duplicate names are matched in order of appearance
            n += 1
            key = f"{name}#{n}"
        out[key] = (i, dims)
    return out


def next_id(contract_id: str, known: Sequence[str]) -> str:
    """The first free ``<base>_v<N+1>`` after the highest version of ``contract_id``'s base."""
    base, _, _ = contract_id.rpartition("_v")
    versions = [
        int(v) for k in known for b, _, v in [k.rpartition("_v")] if b == base and v.isdigit()
    ]
    return f"{base}_v{max(versions, default=0) + 1}"


def newest(contract_id: str, contracts: Sequence[LoadedContract]) -> str:
    """Follow ``supersedes`` links forward to the newest contract of ``contract_id``'s line."""
    superseded_by = {
        lc.contract.supersedes: lc.id for lc in contracts if lc.contract.supersedes is not None
    }
    seen, current = {contract_id}, contract_id
    while current in superseded_by and superseded_by[current] not in seen:
        current = superseded_by[current]
        seen.add(current)
    return current


def _compare_contract(
    old: LoadedContract, new: LoadedContract, file: str, fix: str
) -> list[Finding]:
    old_data = old.contract.model_dump(mode="json")
    new_data = new.contract.model_dump(mode="json")
    marks = positions(new.source)
    found: list[Finding] = []

    def add(rule: str, path: tuple, shown: str, before: object, after: object) -> None:
        line, col = _position(path, marks)
        found.append(
            Finding(
                rule, file, shown, new.id, before, after, line, col,
                fix if RULES[rule].breaking else "",
            )
        )  # fmt: skip

    old_cps = old_data["model_profile"].pop("checkpoints")
    new_cps = new_data["model_profile"].pop("checkpoints")
    for path, before, after in _diff(old_data, new_data, ()):
        add(field_rule(path, added=before is ABSENT), path, _dotted(path), before, after)

    old_by, new_by = _by_name(old_cps), _by_name(new_cps)
    for name, (_, dims) in old_by.items():
        if name not in new_by:
            add("CHECKPOINT_REMOVED", CHECKPOINTS, f"{_dotted(CHECKPOINTS)}[{name}]", dims, ABSENT)
    for name, (index, dims) in new_by.items():
        shown = f"{_dotted(CHECKPOINTS)}[{name}]"
        if name not in old_by:
            add("CHECKPOINT_ADDED", (*CHECKPOINTS, index), shown, ABSENT, dims)
            continue
        for path, before, after in _diff(old_by[name][1], dims, ()):
            add("CHECKPOINT_CHANGED", (*CHECKPOINTS, index, *path), f"{shown}.{_dotted(path)}",
                before, after)  # fmt: skip
    before = [n for n in old_by if n in new_by]
    after = sorted(before, key=lambda n: new_by[n][0])
    moved = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    if moved:  # show the span that moved, not the whole list
        span = slice(moved[0], moved[-1] + 1)
        add("CHECKPOINTS_REORDERED", CHECKPOINTS, _dotted(CHECKPOINTS), before[span], after[span])

    if not found and old.source != new.source:
        found.append(Finding("FORMATTING_CHANGED", file, "", new.id))
    return found


# ---------------------------------------------------------------------------------------------
# Public names of the generated modules.


def public_names(source: bytes) -> set[str]:
    """Top-level names a module defines without a leading underscore, plus its ``__all__``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                if (
                    isinstance(target, ast.Name)
                    and target.id == "__all__"
                    and isinstance(node.value, (ast.List, ast.Tuple))
                ):
                    names.update(
                        e.value
                        for e in node.value.elts
                        if isinstance(e, ast.Constant) and isinstance(e.value, str)
                    )
    return {n for n in names if not n.startswith("_")}


def _modules(rendered: Mapping[str, bytes]) -> dict[tuple[str, str], tuple[str, bytes]]:
    """``{(target, file name): (rendered path, bytes)}``: rendered paths are target/package/file."""
    out = {}
    for path, content in rendered.items():
        parts = PurePosixPath(path).parts
        out[(parts[0], parts[-1])] = (path, content)
    return out


def _compare_names(old: Side, new: Side, config: ProjectConfig) -> list[Finding]:
    old_modules = _modules(render(list(old.contracts), config)) if old.contracts else {}
    new_modules = _modules(render(list(new.contracts), config)) if new.contracts else {}
    gen_dir = _display_dir(config)
    found: list[Finding] = []
    for key in sorted(set(old_modules) | set(old.generated)):
        target, name = key
        before = public_names(old_modules[key][1]) if key in old_modules else set()
        before |= public_names(old.generated[key]) if key in old.generated else set()
        after = public_names(new_modules[key][1]) if key in new_modules else set()
        if key in new_modules:
            rel = new_modules[key][0]
        elif key in old_modules:
            rel = old_modules[key][0]
        else:
            rel = f"{target}/{config.package(target)}/{name}"
        file = f"{gen_dir}{rel}"
        for removed in sorted(before - after):
            found.append(Finding("PUBLIC_NAME_REMOVED", file, removed, None, removed, ABSENT,
                                 fix=NAME_FIX))  # fmt: skip
        if key in new_modules and before:
            for added in sorted(after - before):
                found.append(Finding("PUBLIC_NAME_ADDED", file, added, None, ABSENT, added))
    return found


def _display_dir(config: ProjectConfig) -> str:
    try:
        rel = config.generated_dir.resolve().relative_to(config.root.resolve()).as_posix()
    except ValueError:
        rel = config.generated_dir.as_posix()
    return "" if rel in ("", ".") else f"{rel}/"


# ---------------------------------------------------------------------------------------------


def compare(old: Side, new: Side, config: ProjectConfig) -> list[Finding]:
    """Every change from ``old`` to ``new``, breaking ones first, then info, each sorted."""
    old_by = {lc.id: lc for lc in old.contracts}
    new_by = {lc.id: lc for lc in new.contracts}
    all_ids = sorted(set(old_by) | set(new_by))
    found: list[Finding] = []
    for cid, lc in old_by.items():
        if cid not in new_by:
            file = old.files.get(cid, lc.path.name)
            found.append(
                Finding("CONTRACT_REMOVED", file, "id", cid, cid, ABSENT,
                        fix=REMOVED_FIX.format(file=file))
            )  # fmt: skip
            continue
        latest = newest(cid, list(new.contracts))
        fix = NUMERICS_FIX.format(id=cid, newest=latest, next=next_id(latest, all_ids))
        found += _compare_contract(lc, new_by[cid], new.files.get(cid, lc.path.name), fix)
    for cid, lc in new_by.items():
        if cid not in old_by:
            line, col = _position(("id",), positions(lc.source))
            found.append(
                Finding("CONTRACT_ADDED", new.files.get(cid, lc.path.name), "id", cid, ABSENT,
                        cid, line, col)
            )  # fmt: skip
    found += _compare_names(old, new, config)
    return sorted(found, key=Finding.sort_key)
