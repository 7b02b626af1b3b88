"""Load contract files: YAML with positions, pydantic validation, cross-field rules.

Every problem is reported as ``file:line:col: field.path: what is wrong (what was expected)``,
one per line, and loading either returns valid contracts or raises ``ContractError`` with all of
them. Nothing downstream re-checks a loaded contract.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from .errors import ContractError, Problem
from .models import Contract
from .rules import check_contract

Path_ = tuple[str | int, ...]


# libyaml's parser when PyYAML was built with it (about 5x faster); same nodes, same marks.
_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    """SafeLoader without implicit timestamps: a date-like scalar stays a string."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}

# Composed nodes a contract may expand to: aliases can make a small file huge ("billion laughs").
MAX_NODES = 100_000


class _TooLarge(ValueError):
    pass


class _BadValue(ValueError):
    """A scalar JSON cannot carry (``.inf``, ``.nan``), at its own path."""

    def __init__(self, path: Path_, line: int, col: int, message: str):
        super().__init__(message)
        self.path, self.line, self.col = path, line, col


@dataclass(frozen=True)
class LoadedContract:
    """A validated contract and the file it came from."""

    contract: Contract
    path: Path
    source: bytes

    @property
    def id(self) -> str:
        return self.contract.id


def _display(path: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            pass
    return path.as_posix()


def _to_data(
    node: yaml.Node,
    here: Path_,
    marks: dict[Path_, tuple[int, int]],
    dupes: list,
    constructor: yaml.constructor.SafeConstructor,
    active: set[int],
    budget: list[int],
):
    """Turn a composed YAML node into plain data, recording each path's position.

    ``active`` holds the nodes on the current path (an alias cycle such as ``&a [*a]`` is refused)
    and ``budget`` counts nodes left before an alias-expanded document is refused as too large.
    """
    budget[0] -= 1
    if budget[0] < 0:
        raise _TooLarge(f"document expands to more than {MAX_NODES} nodes (aliases)")
    marks[here] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode | yaml.SequenceNode):
        if id(node) in active:
            raise _TooLarge("recursive alias (a node that contains itself)")
        active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [
                    _to_data(v, here + (i,), marks, dupes, constructor, active, budget)
                    for i, v in enumerate(node.value)
                ]
            out: dict = {}
            for key_node, value_node in node.value:
                key = (
                    key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
                )
                if key in out:
                    dupes.append(
                        (
                            here + (key,),
                            key_node.start_mark.line + 1,
                            key_node.start_mark.column + 1,
                        )
                    )
                out[key] = _to_data(
                    value_node, here + (key,), marks, dupes, constructor, active, budget
                )
                # report a field at its key, not at its value
                marks[here + (key,)] = (
                    key_node.start_mark.line + 1,
                    key_node.start_mark.column + 1,
                )
            return out
        finally:
            active.discard(id(node))
    value = constructor.construct_object(node, deep=True)
    if isinstance(value, float) and not math.isfinite(value):
        line, col = marks[here]
        raise _BadValue(here, line, col, f"must be a finite number (got {node.value})")
    return value


_TYPE_TAG = re.compile(r"^[A-Z]|\[|^(bool|str|int|float|none|constrained-str|json-or-python)$")


def _data_path(loc: Iterable[str | int], data: object = None) -> Path_:
    """Drop pydantic's union-member tags ('bool', 'When', 'literal[...]') from a location.

    With the document's ``data`` the walk is exact: a part is kept when it is a key (or index)
    of the data at that point, so a user's key such as ``A`` is never mistaken for a tag; a
    part that is not in the data is kept only as the last one (a missing field's name).
    """
    parts = list(loc)
    if data is None:
        return tuple(p for p in parts if isinstance(p, int) or not _TYPE_TAG.search(p))
    out: list[str | int] = []
    node = data
    for i, part in enumerate(parts):
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            out.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            out.append(part)
            node = node[part]
        elif i == len(parts) - 1 and not (isinstance(part, str) and _TYPE_TAG.search(part)):
            out.append(part)
    return tuple(out)


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _dotted(path: Path_) -> str:
    """``a.b.0.c``; a key that is empty or holds other characters is written as a JSON string."""
    return ".".join(
        str(p) if isinstance(p, int) or _PLAIN_KEY.fullmatch(p) else json.dumps(p) for p in path
    )


def _position(path: Path_, marks: dict[Path_, tuple[int, int]]) -> tuple[int, int]:
    for n in range(len(path), -1, -1):
        if path[:n] in marks:
            return marks[path[:n]]
    return (1, 1)


def _model_fields_at(path: Path_) -> list[str] | None:
    """Field names of the model that lives at ``path`` (for 'unknown field' hints)."""
    model: type | None = Contract
    for part in path:
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(part)  # type: ignore[union-attr]
        if field is None:
            return None
        model = _first_model(field.annotation)
    return sorted(model.model_fields) if model is not None else None  # type: ignore[union-attr]


def _first_model(annotation) -> type | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def _field_at(path: Path_):
    """The pydantic FieldInfo of the field at ``path``, if the path names one."""
    model: type | None = Contract
    field = None
    for part in path:
        if isinstance(part, int):
            continue
        if model is None:
            return None
        field = model.model_fields.get(part)  # type: ignore[union-attr]
        if field is None:
            return None
        model = _first_model(field.annotation)
    return field


def _describe(annotation) -> str:
    """A short human description of what a field accepts, for 'missing field' hints."""
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin is typing.Literal:
        return " or ".join(json.dumps(a) for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _describe(args[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "a mapping of " + ", ".join(annotation.model_fields)
    if origin is tuple:
        return f"a list (each {_describe(args[0])})" if args else "a list"
    if args:  # a union
        parts = [_describe(a) for a in args]
        if type(None) in typing.get_args(annotation):
            parts.append("null")
        return " or ".join(dict.fromkeys(parts))
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        annotation, "a value"
    )


_YAML11_EXPONENT = re.compile(r"[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+")
_NUMBER_ERRORS = {"float_type", "int_type", "float_parsing", "int_parsing", "int_from_float"}


def _message(err: dict, path: Path_) -> str:
    kind = err["type"]
    got = err.get("input")
    if kind == "missing":
        field = _field_at(path)
        hint = f" (expected {_describe(field.annotation)})" if field is not None else ""
        return f"missing required field{hint}"
    if kind == "extra_forbidden":
        allowed = _model_fields_at(path[:-1])
        close = difflib.get_close_matches(str(path[-1]), allowed or [], n=1) if path else []
        hint = f"did you mean {close[0]!r}? " if close else ""
        hint += f"expected one of: {', '.join(allowed)}" if allowed else ""
        return f"unknown field ({hint})" if hint else "unknown field"
    text = err["msg"]
    text = text[0].lower() + text[1:] if text else text
    if isinstance(got, str) and _YAML11_EXPONENT.fullmatch(got) and kind in _NUMBER_ERRORS:
        mantissa, _, exponent = got.lower().partition("e")
        mantissa += "" if "." in mantissa else ".0"
        fixed = f"{mantissa}e{exponent if exponent[0] in '+-' else '+' + exponent}"
        return (
            f"{text} (got {json.dumps(got)}: YAML 1.1 reads an exponent without a '.' as a "
            f"string; write {fixed})"
        )
    if isinstance(got, dict):
        return text
    shown = json.dumps(got)
    if len(shown) > 80:  # a long value is named, not echoed
        shown = shown[:60] + f"... ({len(shown)} characters)"
    return f"{text} (got {shown})"


def _pydantic_problems(
    exc: ValidationError, file: str, marks: dict[Path_, tuple[int, int]], data: object
) -> list[Problem]:
    merged: dict[Path_, list[str]] = {}
    for err in exc.errors():
        path = _data_path(err["loc"], data)
        msg = _message(err, path)
        if msg not in merged.setdefault(path, []):
            merged[path].append(msg)
    problems = []
    for path, msgs in merged.items():
        if any(len(other) > len(path) and other[: len(path)] == path for other in merged):
            continue  # a union member that got further explains this value better
        line, col = _position(path, marks)
        problems.append(Problem(file, line, col, _dotted(path), "; or ".join(msgs)))
    return problems


def parse_contract(source: bytes, file: str) -> Contract:
    """Parse and validate one contract file's bytes; raise ContractError with every problem."""
    try:
        text = source.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ContractError([Problem(file, 1, 1, "", f"not UTF-8 text ({exc.reason})")]) from None
    try:
        node = yaml.compose(text, Loader=_Loader)
    except RecursionError:
        raise ContractError([Problem(file, 1, 1, "", "invalid YAML: nested too deeply")]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ContractError([Problem(file, line, col, "", f"invalid YAML: {problem}")]) from None
    if node is None or not isinstance(node, yaml.MappingNode):
        raise ContractError(
            [Problem(file, 1, 1, "", "expected a mapping of contract fields at the top level")]
        )
    marks: dict[Path_, tuple[int, int]] = {}
    dupes: list = []
    constructor = yaml.constructor.SafeConstructor()
    constructor.yaml_constructors = _Loader.yaml_constructors
    try:
        data = _to_data(node, (), marks, dupes, constructor, set(), [MAX_NODES])
        payload = json.dumps(data, allow_nan=False)
    except _TooLarge as exc:
        raise ContractError([Problem(file, 1, 1, "", f"unsupported YAML: {exc}")]) from None
    except _BadValue as exc:
        raise ContractError(
            [Problem(file, exc.line, exc.col, _dotted(exc.path), str(exc))]
        ) from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as exc:
        raise ContractError([Problem(file, 1, 1, "", f"unsupported YAML value: {exc}")]) from None
    if dupes:
        raise ContractError(
            [Problem(file, ln, col, _dotted(p), "duplicate key") for p, ln, col in dupes]
        )
    try:
        contract = Contract.model_validate_json(payload, strict=True)
    except ValidationError as exc:
        raise ContractError(_pydantic_problems(exc, file, marks, data)) from None
    findings = check_contract(contract)
    if findings:
        problems = []
        for dotted, message in findings:
            path = tuple(int(p) if p.isdigit() else p for p in dotted.split("."))
            line, col = _position(path, marks)
            problems.append(Problem(file, line, col, dotted, message))
        raise ContractError(problems)
    return contract


def load_contract(path: Path, root: Path | None = None) -> LoadedContract:
    """Load and validate one contract file."""
    file = _display(path, root)
    try:
        source = path.read_bytes()
    except OSError as exc:
        raise ContractError([Problem(file, 1, 1, "", f"cannot read: {exc.strerror}")]) from None
    contract = parse_contract(source, file)
    expected = f"{contract.id}.yaml"
    if path.name != expected:
        raise ContractError(
            [Problem(file, 1, 1, "id", f"file name must be the contract id (expected {expected})")]
        )
    return LoadedContract(contract, path, source)


def _key_position(source: bytes, key: str) -> tuple[int, int]:
    """Line and column of a top-level ``key:`` in a contract file (1:1 if not found)."""
    match = re.search(rb"^" + re.escape(key.encode()) + rb"[ \t]*:", source, re.M)
    if match is None:
        return (1, 1)
    return (source.count(b"\n", 0, match.start()) + 1, 1)


def _supersession_problems(loaded: list[LoadedContract], root: Path | None) -> list[Problem]:
    """``supersedes`` names another known contract, no contract is superseded twice, no cycles."""
    ids = sorted(lc.id for lc in loaded)
    problems, by_old = [], {}
    predecessor = {lc.id: lc.contract.supersedes for lc in loaded}
    for lc in sorted(loaded, key=lambda lc: lc.id):
        sup = lc.contract.supersedes
        if sup is None:
            continue
        file = _display(lc.path, root)
        line, col = _key_position(lc.source, "supersedes")

        def problem(message: str, file: str = file, line: int = line, col: int = col) -> None:
            problems.append(Problem(file, line, col, "supersedes", message))

        if sup == lc.id:
            problem(f"a contract cannot supersede itself ({sup!r}); name the previous version")
            continue
        if sup not in ids:
            problem(f"names unknown contract {sup!r} (known: {', '.join(ids)})")
            continue
        chain, current = [lc.id], sup
        while current is not None and current not in chain:
            chain.append(current)
            current = predecessor.get(current)
        if current == lc.id:
            cycle = " -> ".join([*chain[chain.index(current) :], current])
            problem(f"supersedes cycle {cycle}; a version chain must end at a first version")
        elif current is not None:
            continue  # a cycle further up the chain: reported at the contracts in it
        elif sup in by_old:
            problem(f"{sup!r} is already superseded by {by_old[sup]!r}; a contract has "
                    "at most one successor (supersede the newest version instead)")  # fmt: skip
        else:
            by_old[sup] = lc.id
    return problems


def load_contracts(directory: Path, root: Path | None = None) -> list[LoadedContract]:
    """Load every ``*.yaml`` in a directory, sorted by id; collect every problem before raising."""
    if not directory.is_dir():
        raise ContractError([Problem(str(directory), 1, 1, "", "contracts directory not found")])
    loaded, problems = [], []
    for path in sorted(directory.glob("*.yml")):
        problems.append(Problem(_display(path, root), 1, 1, "",
                                f"contract files end in .yaml: rename it to {path.stem}.yaml"))  # fmt: skip
    for path in sorted(directory.glob("*.yaml")):
        if not path.is_file():  # a FIFO or device would block or never end; a folder is no file
            problems.append(Problem(_display(path, root), 1, 1, "", "not a regular file"))
            continue
        try:
            loaded.append(load_contract(path, root))
        except ContractError as exc:
            problems.extend(exc.problems)
    if not problems:  # links are checked once every file is valid (no follow-on noise)
        problems.extend(_supersession_problems(loaded, root))
    if problems:
        raise ContractError(problems)
    if not loaded:
        raise ContractError([Problem(str(directory), 1, 1, "", "no contract files (*.yaml) found")])
    return sorted(loaded, key=lambda lc: lc.id)
