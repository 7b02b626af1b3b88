"""Emit contract data as Python literals that no contract text can escape from.

Only JSON-shaped data is accepted (dict with str keys, list, str, int, float, bool, None). Strings
are written with every non-printable character escaped, in the quote style the pinned ruff
formatter keeps (double quotes unless the text holds more double than single quotes), so
generated files are format-stable and a hostile string (quotes, backslashes, newlines, ``#``,
unicode line separators) can only ever be data.
"""

from __future__ import annotations

import math
import re

INDENT = "    "
_PLAIN = re.compile(r"[ !#-\[\]-~]*")  # printable ASCII without '"' and backslash


def py_str(text: str) -> str:
    """A Python string literal whose value is exactly ``text``."""
    if _PLAIN.fullmatch(text):  # fast path: nothing to escape, double quotes (ruff's choice)
        return f'"{text}"'
    quote = "'" if text.count('"') > text.count("'") else '"'
    out = [quote]
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == quote:
            out.append("\\" + quote)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif not ch.isprintable() or ch in "\u2028\u2029\ufeff":
            code = ord(ch)
            out.append(
                f"\\x{code:02x}"
                if code < 0x100
                else f"\\u{code:04x}"
                if code < 0x10000
                else f"\\U{code:08x}"
            )
        else:
            out.append(ch)
    out.append(quote)
    return "".join(out)


HOLD = "# one item a line"
"""A comment on a line of its own inside a collection: no formatter joins those lines."""
JOIN_WINDOW = (88, 140)
"""Joined lengths at which one repo's formatter may join a collection onto one line while
another splits it again: black at 119 joins what fits in 119 columns, black at 100 without magic
trailing commas hugs what does not fit in 100 (88..140 holds black's default 88 and every line
length a shipped target sets, with room). A collection whose one-line form, with what stands
before it on its line, falls in this window gets ``HOLD``, so every repo keeps one form."""


def _one_line(value: object) -> str:
    """``value`` as a formatter would join it onto one line."""
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_one_line(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{py_str(k)}: {_one_line(value[k])}" for k in sorted(value)) + "}"
    return py_literal(value)


def py_literal(value: object, level: int = 0, before: int = 0) -> str:
    """A deterministic, formatter-stable Python literal for JSON-shaped ``value`` (``before``:
    the columns that stand before it on its line, indent included)."""
    if value is None:
        return "None"
    if value is True:
        return "True"
    if value is False:
        return "False"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"non-finite float {value!r} cannot be emitted")
        return repr(value)
    if isinstance(value, str):
        return py_str(value)
    inner = INDENT * (level + 1)
    if isinstance(value, list | tuple | dict) and value:
        joined = before + len(_one_line(value)) + 1  # its trailing comma
        hold = f"{inner}{HOLD}\n" if JOIN_WINDOW[0] < joined <= JOIN_WINDOW[1] else ""
    if isinstance(value, list | tuple):
        if not value:
            return "[]"
        items = "".join(f"{inner}{py_literal(v, level + 1, len(inner))},\n" for v in value)
        return f"[\n{hold}{items}{INDENT * level}]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        if not all(isinstance(k, str) for k in value):
            raise TypeError("only string keys can be emitted")
        items = "".join(
            f"{inner}{py_str(k)}: {py_literal(value[k], level + 1, len(inner) + len(py_str(k)) + 2)},\n"
            for k in sorted(value)
        )
        return f"{{\n{hold}{items}{INDENT * level}}}"
    raise TypeError(f"cannot emit {type(value).__name__} as a literal")


def seq_literal(items: list[str], open_: str, close: str) -> str:
    """A sequence of already-emitted items (``(``/``[``) that every formatter keeps as written:
    one item, inline; more, one a line under ``HOLD`` (the ids in a 101-119 column ``Literal``
    otherwise have no form black at 119 and black at 100 both keep)."""
    if len(items) == 1:
        return f"{open_}{items[0]},{close}" if open_ == "(" else f"{open_}{items[0]}{close}"
    body = "".join(f"{INDENT}{item},\n" for item in items)
    return f"{open_}\n{INDENT}{HOLD}\n{body}{close}"
