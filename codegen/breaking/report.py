"""Print findings as text, JSON or GitHub workflow annotations.

Each formatter returns ``(stdout, stderr)``: findings go to stdout, the one-line summary to stderr
(as ``contractgen check`` does), so ``--format json`` stays machine-readable.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .compare import ABSENT, Finding
from .rules import RULES

SHOW_LIMIT = 72


def show(value: object) -> str:
    """A value as it reads in a finding: JSON, shortened when long."""
    if value is ABSENT:
        return "(absent)"
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return text if len(text) <= SHOW_LIMIT else text[: SHOW_LIMIT - 1] + "…"


def _where(f: Finding, file: str | None = None) -> str:
    where = file if file is not None else f.file
    if f.line is not None:
        where += f":{f.line}:{f.col}"
    return where


def _what(f: Finding) -> str:
    """``path: old → new``; a whole entry (contract, checkpoint, name) reads ``added``/``removed``."""
    if not f.path:
        return RULES[f.rule].summary
    if f.old is ABSENT:
        return f"{f.path}: added"
    if f.new is ABSENT:
        return f"{f.path}: removed"
    return f"{f.path}: {show(f.old)} → {show(f.new)}"


def _summary(findings: Sequence[Finding], against: str, verbose: bool) -> str:
    breaking = [f for f in findings if f.breaking]
    infos = len(findings) - len(breaking)
    if breaking:
        contracts = sorted({f.contract for f in breaking if f.contract})
        scope = f" in {', '.join(contracts)}" if contracts else ""
        return f"breaking: {len(breaking)} breaking change(s) against {against}{scope}\n"
    hint = "; -v lists them" if infos and not verbose else ""
    return f"breaking: ok against {against} ({infos} non-breaking change(s){hint})\n"


def format_text(
    findings: Sequence[Finding], against: str, verbose: bool = False
) -> tuple[str, str]:
    lines = []
    for f in findings:
        if f.breaking:
            lines.append(f"{_where(f)}: {_what(f)} [{f.rule}]")
        elif verbose:
            lines.append(f"info: {_where(f)}: {_what(f)} [{f.rule}]")
    fixes = list(dict.fromkeys(f.fix for f in findings if f.breaking and f.fix))
    if fixes:
        lines.append("")
        lines.extend(f"fix: {fix}" for fix in fixes)
    out = "".join(f"{line}\n" for line in lines)
    return out, _summary(findings, against, verbose)


def finding_json(f: Finding) -> dict:
    data: dict = {
        "rule": f.rule,
        "breaking": f.breaking,
        "contract": f.contract,
        "file": f.file,
        "line": f.line,
        "col": f.col,
        "path": f.path,
        "message": RULES[f.rule].summary,
    }
    if f.old is not ABSENT:
        data["old"] = f.old
    if f.new is not ABSENT:
        data["new"] = f.new
    if f.fix:
        data["fix"] = f.fix
    return data


def format_json(
    findings: Sequence[Finding], against: str, verbose: bool = False
) -> tuple[str, str]:
    """Breaking findings and info, always both (``verbose`` changes nothing here)."""
    report = {
        "against": against,
        "ok": not any(f.breaking for f in findings),
        "breaking": [finding_json(f) for f in findings if f.breaking],
        "info": [finding_json(f) for f in findings if not f.breaking],
    }
    return json.dumps(report, indent=2, ensure_ascii=False) + "\n", _summary(
        findings, against, verbose
    )


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def format_github(
    findings: Sequence[Finding], against: str, verbose: bool = False, prefix: str = ""
) -> tuple[str, str]:
    """``::error file=…,line=…,title=…::…`` per finding; ``prefix`` maps files to repo paths."""
    lines = []
    for f in findings:
        if not f.breaking and not verbose:
            continue
        props = [f"file={_escape_property(prefix + f.file)}"]
        if f.line is not None:
            props += [f"line={f.line}", f"col={f.col}"]
        title = f"{f.rule} ({f.contract})" if f.contract else f.rule
        props.append(f"title={_escape_property(title)}")
        message = _what(f) + (f". {f.fix}" if f.fix else "")
        level = "error" if f.breaking else "notice"
        lines.append(f"::{level} {','.join(props)}::{_escape_data(message)}")
    return "".join(f"{line}\n" for line in lines), _summary(findings, against, verbose)
