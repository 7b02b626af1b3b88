"""A pydantic ``ValidationError`` as one line per problem, at the YAML position of the value:
``file:line:col: field.path: what is wrong (what was expected)``. The field's type is described
in words, a misspelt key names the nearest valid one."""

from __future__ import annotations

import difflib
import json
import re
import typing
from collections.abc import Iterable

from pydantic import BaseModel, ValidationError

from .errors import Problem
from .models import Contract

Path_ = tuple[str | int, ...]


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


def dotted_path(path: Path_) -> str:
    """``a.b.0.c``; a key that is empty or holds other characters is written as a JSON string."""
    return ".".join(
        str(p) if isinstance(p, int) or _PLAIN_KEY.fullmatch(p) else json.dumps(p) for p in path
    )


def field_position(path: Path_, marks: dict[Path_, tuple[int, int]]) -> tuple[int, int]:
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


def pydantic_problems(
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
        line, col = field_position(path, marks)
        problems.append(Problem(file, line, col, dotted_path(path), "; or ".join(msgs)))
    return problems
