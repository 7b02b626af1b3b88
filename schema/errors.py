"""Contract errors that name the place and the fix: ``file:line:col: field.path: what (expected)``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a contract file."""

    file: str
    line: int
    col: int
    path: str
    message: str

    def __str__(self) -> str:
        where = f"{_printable(self.file)}:{self.line}:{self.col}"
        path, message = _printable(self.path), _printable(self.message)
        return f"{where}: {path}: {message}" if path else f"{where}: {message}"


def _printable(text: str) -> str:
    """``text`` with line breaks and other unprintable characters escaped: one problem, one line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in text)


class ContractError(Exception):
    """Raised when one or more contract files are invalid; carries every problem found."""

    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))
