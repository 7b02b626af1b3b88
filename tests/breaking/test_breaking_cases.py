"""One case folder per rule: ``cases/<rule>/mutate.py`` changes a committed project, and
``expected.txt`` pins what ``contractgen breaking --against HEAD~1 -v`` prints and its exit code.

``mutate.py`` defines ``mutate(root)`` (the change, committed on top of the base) and optionally
``base(root)`` (applied before the base commit) and ``ARGS`` (extra arguments); helpers come
from breaking_support.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
from breaking_support import (
    HERE,
    check_golden,
    commit,
    make_repo,
    transcript,
)

from contractgen.codegen.breaking.rules import FIELD_RULES, RULES
from contractgen.schema.models import Contract

CASES = HERE / "cases"
CASE_NAMES = sorted(p.name for p in CASES.iterdir() if (p / "mutate.py").is_file())


def run_case(case: Path, root: Path) -> str:
    ns = runpy.run_path(str(case / "mutate.py"))
    if "base" in ns:
        make_repo_with_base(root, ns["base"])
    else:
        make_repo(root)
    ns["mutate"](root)
    commit(root, f"case {case.name}")
    return transcript(root, ["breaking", "--against", "HEAD~1", "-v", *ns.get("ARGS", [])])


def make_repo_with_base(root: Path, base) -> None:
    make_repo(root)
    base(root)
    commit(root, "base, adjusted by the case")


@pytest.mark.parametrize("name", CASE_NAMES)
def test_case(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "project"
    monkeypatch.chdir(tmp_path)
    check_golden(CASES / name / "expected.txt", run_case(CASES / name, root))


# Rules no contract edit alone can trigger, each with where it is tested instead.
NOT_A_CONTRACT_EDIT = {
    # a new target needs its policy model and templates in code first; the rule is exercised on
    # contract data in test_breaking_units.py::test_adding_a_target_policy_is_not_breaking_changing_one_is
    "TARGET_POLICY_ADDED",
}


def test_every_rule_has_a_case_folder() -> None:
    assert {r.lower() for r in set(RULES) - NOT_A_CONTRACT_EDIT} <= set(CASE_NAMES)
    assert NOT_A_CONTRACT_EDIT <= set(RULES)


def test_every_contract_field_is_classified() -> None:
    assert set(FIELD_RULES) == set(Contract.model_fields)
    assert set(FIELD_RULES.values()) <= set(RULES)


def test_expected_exit_code_matches_the_rule_kind() -> None:
    """A breaking rule's case exits 1; a fine rule's case exits 0."""
    for rule in RULES.values():
        if rule.id in NOT_A_CONTRACT_EDIT:
            continue
        expected = (CASES / rule.id.lower() / "expected.txt").read_text()
        assert expected.splitlines()[1] == f"exit {1 if rule.breaking else 0}", rule.id
        assert f"[{rule.id}]" in expected, rule.id
