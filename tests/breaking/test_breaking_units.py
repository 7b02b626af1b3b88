"""Small pure helpers of the breaking check: next id, supersession chains, names, positions."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

from contractgen.codegen.breaking.compare import (
    _compare_contract,
    newest,
    next_id,
    positions,
    public_names,
)
from contractgen.codegen.breaking.rules import RULES
from contractgen.codegen.fingerprint import contract_fingerprint
from contractgen.schema.loader import parse_contract

ROOT = Path(__file__).resolve().parents[2]


def test_next_id_skips_every_existing_version() -> None:
    known = ["qwen3_dense_v1", "qwen3_dense_v2", "qwen3_dense_v10", "other_v30"]
    assert next_id("qwen3_dense_v1", known) == "qwen3_dense_v11"
    assert next_id("fresh_v1", known) == "fresh_v1"


def _lc(cid: str, supersedes: str | None) -> SimpleNamespace:
    return SimpleNamespace(id=cid, contract=SimpleNamespace(supersedes=supersedes))


def test_newest_follows_supersedes_and_stops_on_a_cycle() -> None:
    chain = [_lc("a_v1", None), _lc("a_v2", "a_v1"), _lc("a_v3", "a_v2")]
    assert newest("a_v1", chain) == "a_v3"
    assert newest("a_v3", chain) == "a_v3"
    cycle = [_lc("b_v1", "b_v2"), _lc("b_v2", "b_v1")]
    assert newest("b_v1", cycle) == "b_v2"


def test_public_names_are_defined_names_and_all() -> None:
    source = b"""
from x import imported, exported
import os
PUBLIC = 1
_private = 2
typed: int = 3
def fn(): ...
class Cls: ...
__all__ = ["exported", "fn"]
if True:
    NESTED = 4
"""
    assert public_names(source) == {"PUBLIC", "typed", "fn", "Cls", "exported"}


def test_positions_name_keys_inside_flow_mappings() -> None:
    marks = positions(b"a:\n  b: {c: 1, d: [1, 2]}\n  e:\n    - {name: x, f: 2}\n")
    assert marks[("a", "b", "d")] == (2, 13)
    assert marks[("a", "e", 0, "f")] == (4, 17)
    assert positions(b"a: [unclosed\n") == {}


def test_adding_a_target_policy_is_not_breaking_changing_one_is() -> None:
    """A new target's runtime policy under a shipped id is TARGET_POLICY_ADDED (non-breaking:
    the numerics fingerprint does not see it); changing an existing target's policy breaks."""
    source = (ROOT / "contracts" / "qwen3_dense_true_on_policy_v1.yaml").read_bytes()
    data = parse_contract(source, "v1.yaml").model_dump(mode="json")

    def loaded(d: dict) -> SimpleNamespace:
        contract = SimpleNamespace(model_dump=lambda mode: copy.deepcopy(d), id=d["id"])
        return SimpleNamespace(contract=contract, source=source, id=d["id"])

    added = copy.deepcopy(data)
    added["runtime_policy"]["vllm"] = {"enabled": True, "batch_invariant": True}
    found = _compare_contract(loaded(data), loaded(added), "v1.yaml", "fix")
    assert [(f.rule, RULES[f.rule].breaking) for f in found] == [("TARGET_POLICY_ADDED", False)]
    assert contract_fingerprint(added) == contract_fingerprint(data)
    changed = copy.deepcopy(data)
    changed["runtime_policy"]["sglang"]["disable_reduce_scatter"] = False
    found = _compare_contract(loaded(data), loaded(changed), "v1.yaml", "fix")
    assert [(f.rule, RULES[f.rule].breaking) for f in found] == [("RUNTIME_POLICY_CHANGED", True)]
