"""Rendered SGLang server arguments against the real release's parser (``ServerArgs.add_cli_args``).

Proves the table both ways: every emitted flag the release knows parses to the value meant, and
the flags it does not know are exactly UNRELEASED_SGLANG_FLAGS, which ``plan`` reports as needing
a newer SGLang. Needs ``pip install -e '.[sglang-args]'`` and ``pip install --no-deps
sglang==0.5.23`` (tools/install-dev.sh does both); runs the parser in a subprocess.
"""

from __future__ import annotations

from typing import Any

import pytest

from contractgen.adapters.launcher import Layout, build_plan
from contractgen.adapters.launcher.rows import Forbid
from contractgen.adapters.launcher.tables import (
    SGLANG_RELEASE,
    SGLANG_SERVER,
    UNRELEASED_SGLANG_FLAGS,
)
from contractgen.codegen.vendored import load_target

SCHEMA = load_target("launcher").schema
CONTRACT_IDS = SCHEMA.CONTRACT_IDS
# family -> (a small checkpoint, one that runs at TP=4)
MODELS = {
    "qwen3_dense": ("Qwen3-0.6B", "Qwen3-4B"),
    "llama3_dense": ("Llama-3.2-1B", "Llama-3.1-8B"),
    "qwen3_moe": ("Qwen3-30B-A3B", "Qwen3-235B-A22B"),
    "qwen3_next": ("Qwen3-Next-80B-A3B", None),  # 2 KV heads: no TP=4
}


def _models(cid: str) -> tuple[str, str | None]:
    """The family's (small, TP=4) pair; the TP=4 one where the contract does not list the small
    one (qwen3_moe_true_on_policy_v3 has no Qwen3-30B-A3B: its experts are not whole runs); None
    for a family none of whose checkpoints runs at TP=4."""
    profile = SCHEMA.model_profile_for(cid)
    small, tp4 = MODELS[profile.family]
    return (small if small in {c.name for c in profile.checkpoints} else tp4), tp4


CASES = [
    (cid, model, layout)
    for cid in CONTRACT_IDS
    for small, tp4 in [_models(cid)]
    for model, layout in (
        (small, Layout()),
        (small, Layout(tp=2, rollout_dp=2)),
        (tp4, Layout(tp=4, rollout_tp=4)),
        ("reference", Layout(rollout_tp=2)),
    )
    if model is not None
]
PLANS = [build_plan(cid, layout, model) for cid, model, layout in CASES]
TABLE_FLAGS = sorted(
    {getattr(row, "flag", None) for row in SGLANG_SERVER} - {None} | set(UNRELEASED_SGLANG_FLAGS)
)


@pytest.fixture(scope="module")
def probed(sglang_probe) -> dict[str, Any]:
    arg_lists = [
        [a for r in plan.rows if r.table == "sglang" and r.kind == "arg" for a in r.args]
        for plan in PLANS
    ]
    return sglang_probe(arg_lists, TABLE_FLAGS)


def test_probe_runs_the_pinned_release(probed: dict[str, Any]) -> None:
    assert probed["version"] == SGLANG_RELEASE


def test_unreleased_table_is_exactly_what_the_release_lacks(probed: dict[str, Any]) -> None:
    unknown = {flag for flag, info in probed["flags"].items() if not info["known"]}
    assert unknown == set(UNRELEASED_SGLANG_FLAGS)


def test_forbidden_flags_are_real_flags(probed: dict[str, Any]) -> None:
    for row in SGLANG_SERVER:
        if isinstance(row, Forbid):
            assert probed["flags"][row.flag]["known"], row.flag


@pytest.mark.parametrize(
    "index", range(len(CASES)), ids=lambda i: f"{CASES[i][0][-2:]}-{CASES[i][1]}-{CASES[i][2]}"
)
def test_rendered_args_parse_to_the_meant_values(index: int, probed: dict[str, Any]) -> None:
    plan, parsed = PLANS[index], probed["parsed"][index]
    assert "error" not in parsed, parsed.get("error")
    # The only arguments the release does not take are the reported unreleased ones.
    reported = [f for f, _ in plan.needs_newer_sglang]
    assert [a for a in parsed["unknown"] if a.startswith("--")] == reported
    values = parsed["set"]
    assert values["model_path"] == plan.model.name
    assert values.get("tp_size", 1) == plan.layout.rollout_tp_size
    assert values.get("dp_size", 1) == plan.layout.rollout_dp
    assert values["enable_deterministic_inference"] is True
    assert values["attention_backend"] == "fa3"
    assert values["dtype"] == "bfloat16"
    assert values["enable_fused_qk_norm_rope"] is False
    fusion_off = plan.layout.rollout_tp_size > 1
    assert values.get("enforce_disable_flashinfer_allreduce_fusion", False) is fusion_off
    # Every emitted released flag changed something (no flag the parser takes and ignores).
    for row in plan.rows:
        if row.table == "sglang" and row.kind == "arg" and row.emitted:
            info = probed["flags"][row.args[0]]
            if info["known"] and row.args[1:] not in (("1",),):
                assert info["dest"] in values, row.args
