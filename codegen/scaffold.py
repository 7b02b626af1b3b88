"""Scaffold a contract from an existing one: the old file with a new ``id`` and ``supersedes``.

The edit is made on the YAML text (the spans of the two values, found with ``yaml.compose``), so
comments, key order and formatting survive; the result is then validated like any contract file.
Pure: bytes in, bytes out; the ``new`` command does the checks that need the project and writes.
"""

from __future__ import annotations

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
