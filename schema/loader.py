"""Load contract files: YAML with positions, pydantic validation, cross-field rules.

Every problem is reported as ``file:line:col: field.path: what is wrong (what was expected)``,
one per line, and loading either returns valid contracts or raises ``ContractError`` with all of
them. Nothing downstream re-checks a loaded contract.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import ValidationError

from .errors import ContractError, Problem
from .messages import Path_, dotted_path, field_position, pydantic_problems
from .models import Contract
from .rules import check_contract

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
            [Problem(file, exc.line, exc.col, dotted_path(exc.path), str(exc))]
        ) from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as exc:
        raise ContractError([Problem(file, 1, 1, "", f"unsupported YAML value: {exc}")]) from None
    if dupes:
        raise ContractError(
            [Problem(file, ln, col, dotted_path(p), "duplicate key") for p, ln, col in dupes]
        )
    try:
        contract = Contract.model_validate_json(payload, strict=True)
    except ValidationError as exc:
        raise ContractError(pydantic_problems(exc, file, marks, data)) from None
    findings = check_contract(contract)
    if findings:
        problems = []
        for dotted, message in findings:
            path = tuple(int(p) if p.isdigit() else p for p in dotted.split("."))
            line, col = field_position(path, marks)
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
