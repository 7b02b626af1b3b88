"""Scaffold a contract from an existing one: the old file with a new ``id`` and ``supersedes``.

The edit is made on the YAML text (the spans of the two values, found with ``yaml.compose``), so
comments, key order and formatting survive; the result is then validated like any contract file.
Pure: bytes in, bytes out; the ``new`` command does the checks that need the project and writes.
"""

from __future__ import annotations

import json

import yaml

from ..schema.loader import parse_contract


class ScaffoldError(ValueError):
    """The old contract file cannot be edited as text (e.g. ``id`` is not a plain top-level key)."""


def _top_level(text: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if not isinstance(node, yaml.MappingNode):
        raise ScaffoldError("expected a mapping of contract fields at the top level")
    return {k.value: (k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode)}


def scaffold(source: bytes, new_id: str, supersedes: str | None, file: str) -> bytes:
    """``source`` with ``id: new_id`` and ``supersedes: …`` set; raises ContractError if invalid.

    ``supersedes`` is the old id for a new version of the same line, None for a new line.
    """
    text = source.decode("utf-8")
    fields = _top_level(text)
    if "id" not in fields or not isinstance(fields["id"][1], yaml.ScalarNode):
        raise ScaffoldError(f"{file}: no top-level scalar 'id' to replace")
    link = "null" if supersedes is None else supersedes
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement), non-overlapping
    id_value = fields["id"][1]
    edits.append((id_value.start_mark.index, id_value.end_mark.index, new_id))
    if "supersedes" in fields:
        key, value = fields["supersedes"]
        if not isinstance(value, yaml.ScalarNode):
            raise ScaffoldError(f"{file}: 'supersedes' is not a scalar")
        start, end = value.start_mark.index, value.end_mark.index
        if start == end:  # `supersedes:` with no value: write one after the colon
            start = end = key.end_mark.index + text[key.end_mark.index :].index(":") + 1
            edits.append((start, end, f" {link}"))
        else:
            edits.append((start, end, link))
    elif supersedes is not None:  # a new line right after the id line
        line_end = text.find("\n", id_value.end_mark.index)
        at = len(text) if line_end < 0 else line_end + 1
        prefix = "" if line_end >= 0 else "\n"
        edits.append((at, at, f"{prefix}supersedes: {supersedes}\n"))
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    result = text.encode("utf-8")
    contract = parse_contract(result, file)
    if contract.id != new_id or contract.supersedes != supersedes:  # a text edit that missed
        raise ScaffoldError(f"{file}: could not set id and supersedes by editing the text")
    return result


def _scalar(value: object) -> str:
    """A YAML flow scalar: plain where that reads back as the same string, else JSON-quoted."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    plain = text and text[0].isalnum() and all(ch.isalnum() or ch in "._-" for ch in text)
    if plain and yaml.safe_load(text) == text:
        return text
    return json.dumps(text)


def flow(value: object) -> str:
    """``value`` (dicts, lists, scalars) as one YAML flow expression, keys in the given order."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    if value is None:
        return "null"
    return _scalar(value)


def _wrapped_item(entry: dict, indent: int, width: int = 100) -> str:
    """``- {k: v, …}`` as the contracts write checkpoints: wrapped at ``width``, continuation
    lines aligned one column inside the brace."""
    parts = [f"{k}: {flow(v)}" for k, v in entry.items()]
    lines, line = [], " " * indent + "- {"
    for i, part in enumerate(parts):
        piece = part + ("}" if i == len(parts) - 1 else ",")
        if line.endswith(("{", "\n")) or len(line) + 1 + len(piece) <= width:
            line += ("" if line.endswith("{") else " ") + piece
        else:
            lines.append(line)
            line = " " * (indent + 3) + piece
    lines.append(line)
    return "\n".join(lines) + "\n"


def add_checkpoints(source: bytes, entries: list[dict], file: str) -> bytes:
    """``source`` with ``entries`` appended to ``model_profile.checkpoints`` (text edit: comments
    and formatting kept); raises ContractError if the result does not validate."""
    text = source.decode("utf-8")
    fields = _top_level(text)
    profile = fields.get("model_profile", (None, None))[1]
    if not isinstance(profile, yaml.MappingNode):
        raise ScaffoldError(f"{file}: no top-level 'model_profile' mapping")
    seq = next(
        (
            v
            for k, v in profile.value
            if isinstance(k, yaml.ScalarNode) and k.value == "checkpoints"
        ),
        None,
    )
    if not isinstance(seq, yaml.SequenceNode) or seq.flow_style or not seq.value:
        raise ScaffoldError(f"{file}: model_profile.checkpoints is not a block list to append to")
    last = seq.value[-1]
    indent = seq.start_mark.column  # the column of the first '-'
    line_end = text.find("\n", last.end_mark.index)
    at = len(text) if line_end < 0 else line_end + 1
    prefix = "" if line_end >= 0 else "\n"
    added = "".join(_wrapped_item(e, indent) for e in entries)
    result = (text[:at] + prefix + added + text[at:]).encode("utf-8")
    contract = parse_contract(result, file)
    names = [d.name for d in contract.model_profile.checkpoints]
    if names[-len(entries) :] != [e["name"] for e in entries]:  # a text edit that missed
        raise ScaffoldError(
            f"{file}: could not append to model_profile.checkpoints by editing text"
        )
    return result
