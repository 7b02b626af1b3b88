"""Breaking-change detection for contracts: what ``buf breaking`` is for protobuf.

A contract id is a promise to three repositories: once shipped, its numerics never change. The
check compares a baseline (a git ref or a directory of contracts) with the current contracts and
reports each change with its rule (``rules.py``); ``compare.py`` is the pure comparison,
``baseline.py`` reads the old side, ``report.py`` prints text, JSON or GitHub annotations.
"""

from __future__ import annotations

from .baseline import Baseline, BaselineError, load_baseline
from .compare import ABSENT, Finding, Side, compare
from .report import format_github, format_json, format_text
from .rules import RULES, Rule

__all__ = [
    "ABSENT",
    "RULES",
    "Baseline",
    "BaselineError",
    "Finding",
    "Rule",
    "Side",
    "compare",
    "format_github",
    "format_json",
    "format_text",
    "load_baseline",
]
