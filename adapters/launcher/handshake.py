"""The fingerprint handshake: rollout and trainer must run the same contract from intact copies.

Each side reports the contract it runs and what its vendored ``schema.py`` says about it: the
fingerprint, the ids it knows, what supersedes what, and whether the file is intact (its body
still matches the sha256 in its header, and its contract data its fingerprints). The copy is read
with ``ast``, never executed. ``check_handshake`` refuses to start on any disagreement.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import generated

# Module-level names of schema.py a report reads (all plain literals).
_REPORTED = ("CONTRACT_IDS", "FINGERPRINTS", "SUPERSEDED_BY", "CONTRACT_DATA")


@dataclass(frozen=True)
class HandshakeReport:
    """What one side says: its contract id, and its vendored schema.py's view of it."""

    side: str  # "rollout" | "trainer"
    schema_path: str
    contract_id: str
    fingerprint: str | None  # None: this copy does not define contract_id
    known_contracts: tuple[str, ...]
    superseded_by: Mapping[str, str] = field(default_factory=dict)
    intact: bool = True
    problem: str | None = None  # why the copy is not intact


class HandshakeError(RuntimeError):
    """The two sides disagree; ``kind`` says how."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


def _literals(source: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign):
            target = node.target
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        else:
            continue
        if isinstance(target, ast.Name) and target.id in _REPORTED and node.value is not None:
            try:
                values[target.id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return values


def handshake_report(package_dir: str | Path, contract_id: str, side: str) -> HandshakeReport:
    """Report of the side whose vendored package (the folder holding schema.py) is ``package_dir``
    and which runs ``contract_id``."""
    path = Path(package_dir) / "schema.py"
    if not path.is_file():
        raise FileNotFoundError(f"{side}: no vendored schema.py at {path}")
    ours = generated.schema()
    problem = None
    if not ours.verify_file(str(path)):
        problem = "its body no longer matches the sha256 in its header"
    try:
        values = _literals(path.read_text(encoding="utf-8"))
    except SyntaxError as exc:
        values, problem = {}, f"it does not parse ({exc.msg}, line {exc.lineno})"
    fingerprints = values.get("FINGERPRINTS", {})
    data = values.get("CONTRACT_DATA", {})
    edited = [
        cid for cid in sorted(data) if ours.compute_fingerprint(data[cid]) != fingerprints.get(cid)
    ]
    if problem is None and edited:
        problem = f"its data for {', '.join(edited)} no longer matches the recorded fingerprint"
    return HandshakeReport(
        side=side,
        schema_path=str(path),
        contract_id=contract_id,
        fingerprint=fingerprints.get(contract_id),
        known_contracts=tuple(values.get("CONTRACT_IDS", ())),
        superseded_by=dict(values.get("SUPERSEDED_BY", {})),
        intact=problem is None,
        problem=problem,
    )


def _newest(contract_id: str, superseded_by: Mapping[str, str]) -> list[str]:
    """``contract_id`` followed by every contract that (transitively) supersedes it."""
    chain = [contract_id]
    while (nxt := superseded_by.get(chain[-1])) is not None and nxt not in chain:
        chain.append(nxt)
    return chain


def check_handshake(rollout: HandshakeReport, trainer: HandshakeReport) -> str:
    """The agreed ``contract_id fingerprint``; HandshakeError when the sides must not start."""
    for r in (rollout, trainer):
        if not r.intact:
            raise HandshakeError(
                "hand_edited",
                f"refusing to start: the {r.side}'s vendored {r.schema_path} was edited by hand "
                f"({r.problem}); regenerate it with `contractgen sync --force`",
            )
    a, b = rollout.contract_id, trainer.contract_id
    if a != b:
        merged = {
            **generated.schema().SUPERSEDED_BY,
            **rollout.superseded_by,
            **trainer.superseded_by,
        }
        for old, new in ((a, b), (b, a)):
            chain = _newest(old, merged)
            if new in chain:
                newest = chain[-1]
                raise HandshakeError(
                    "different_version",
                    f"refusing to start: different versions of the contract: the rollout runs "
                    f"{a}, the trainer runs {b}; {old} is superseded by {newest}: run both "
                    f"sides with --true-on-policy-contract {newest}",
                )
        raise HandshakeError(
            "different_contract",
            f"refusing to start: different contracts: the rollout runs {a}, the trainer runs {b}; "
            "their logprobs are not comparable: run both sides with the same contract",
        )
    for r in (rollout, trainer):
        if r.fingerprint is None:
            known = ", ".join(r.known_contracts) or "none"
            raise HandshakeError(
                "unknown_contract",
                f"refusing to start: the {r.side}'s vendored {r.schema_path} does not define {a} "
                f"(it knows: {known}); update it with `contractgen sync`",
            )
    if rollout.fingerprint != trainer.fingerprint:
        raise HandshakeError(
            "stale_copy",
            f"refusing to start: both sides run {a} but their vendored copies disagree on it "
            f"(rollout {rollout.fingerprint}, trainer {trainer.fingerprint}): one copy is stale; "
            "run `contractgen sync` for both repos",
        )
    return f"{a} {rollout.fingerprint}"
