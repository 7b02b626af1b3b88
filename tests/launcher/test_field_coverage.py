"""No silently ignored policy field: every field of the three generated runtime-policy dataclasses
is rendered by some table row (argument, environment, engine-side note or forbidden flag) or is
listed in NOT_LAUNCH_RELEVANT with a reason. The field list comes from ``dataclasses.fields`` of
the generated classes, so a field added to a contract fails here until it is rendered."""

from __future__ import annotations

import dataclasses

import pytest

from contractgen.adapters.launcher import Layout, build_plan, to_json_data
from contractgen.adapters.launcher.layout import subject_for, violations
from contractgen.adapters.launcher.plan import sources
from contractgen.adapters.launcher.tables import NOT_LAUNCH_RELEVANT, TABLES
from contractgen.codegen.vendored import load_target

CONTRACT_IDS = load_target("launcher").schema.CONTRACT_IDS
POLICY_TARGETS = ("launcher", "sglang", "megatron")
LAYOUTS = [Layout(), Layout(tp=2, cp=2, dp=2), Layout(tp=4, pp=2, rollout_tp=2)]


def _policy_fields() -> set[str]:
    names = set()
    for target in POLICY_TARGETS:
        cls = type(load_target(target).runtime_policy.DEFAULT_RUNTIME_POLICY)
        names |= {f"{target}.{f.name}" for f in dataclasses.fields(cls)}
    return names


def _row_sources() -> set[str]:
    return {row.source for rows in TABLES.values() for row in rows}


def test_every_policy_field_is_rendered_or_explained() -> None:
    missing = sorted(_policy_fields() - _row_sources() - set(NOT_LAUNCH_RELEVANT))
    assert not missing, (
        "runtime-policy fields no table renders (add a row in adapters/launcher/tables.py, or "
        f"list them in NOT_LAUNCH_RELEVANT with a reason): {missing}"
    )


def test_not_launch_relevant_names_real_fields_with_reasons() -> None:
    assert set(NOT_LAUNCH_RELEVANT) <= _policy_fields()
    assert not set(NOT_LAUNCH_RELEVANT) & _row_sources()
    assert all(len(reason) > 10 for reason in NOT_LAUNCH_RELEVANT.values())


@pytest.mark.parametrize("contract_id", CONTRACT_IDS)
def test_every_row_source_exists(contract_id: str) -> None:
    values = sources(subject_for(contract_id, Layout()))
    for table, rows in TABLES.items():
        for row in rows:
            namespace, _, name = row.source.partition(".")
            assert hasattr(values[namespace], name), f"{table}: {row.source}"
            assert row.reason.strip(), f"{table}: {row.source} has no reason"


def _admitted(contract_id: str, layout: Layout) -> Layout:
    """``layout``, with CP 1 where the contract allows no CP (Qwen3-Next: linear-attention
    layers) and TP 2 where no checkpoint runs at its TP (2 KV heads): the same fields render."""
    allowed = load_target("launcher").schema.parallel_support_for(contract_id)
    if layout.cp not in allowed.train_cp_sizes:
        layout = dataclasses.replace(layout, cp=1)
    if layout.tp not in allowed.train_tp_sizes or not any(
        not violations(subject_for(contract_id, layout, d.name))
        for d in load_target("launcher").schema.model_profile_for(contract_id).checkpoints
    ):
        layout = dataclasses.replace(layout, tp=2)
    return layout


def _model_for(contract_id: str, layout: Layout) -> str:
    """The contract's first checkpoint that admits ``layout`` (Qwen3-30B-A3B's expert down_proj
    rules out TP=4, so the MoE contract's TP=4 layout is planned for Qwen3-235B-A22B)."""
    for dims in load_target("launcher").schema.model_profile_for(contract_id).checkpoints:
        if not violations(subject_for(contract_id, layout, dims.name)):
            return dims.name
    raise AssertionError(f"no checkpoint of {contract_id} admits {layout}")


@pytest.mark.parametrize("contract_id", CONTRACT_IDS)
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_every_true_field_reaches_the_output(contract_id: str, layout: Layout) -> None:
    """Each policy field shows up in the JSON rows with its value, and each emitted argument
    is on one of the two command lines (or in the environment)."""
    layout = _admitted(contract_id, layout)
    plan = build_plan(contract_id, layout, _model_for(contract_id, layout))
    data = to_json_data(plan)
    shown = {row["source"] for row in data["rows"]}
    assert _policy_fields() - set(NOT_LAUNCH_RELEVANT) <= shown
    commands = {*plan.rollout_command, *plan.trainer_command}
    for row in plan.rows:
        if row.kind == "arg" and row.emitted:
            assert set(row.args) <= commands, row
        if row.kind == "env":
            assert plan.env[row.args[0]] == row.args[1]


@pytest.mark.parametrize("contract_id", CONTRACT_IDS)
def test_miles_flags_follow_the_policy_exactly(contract_id: str) -> None:
    plan = build_plan(contract_id, Layout())
    policy = load_target("launcher").runtime_policy.policy_for(contract_id)
    trainer = plan.trainer_command
    assert ("--recompute-logprobs-via-prefill" in trainer) == policy.recompute_logprobs_via_prefill
    assert ("--deterministic-mode" in trainer) == policy.deterministic_mode
    assert ("--true-on-policy-mode" in trainer) == policy.true_on_policy_mode
    assert plan.env["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] == "0"
    assert plan.env["CUBLAS_WORKSPACE_CONFIG"] == policy.cublas_workspace_config
    assert plan.env["NCCL_ALGO"] == policy.nccl_algo


def test_logprob_contract_decides_the_prefill_rescore() -> None:
    """v1 scores against SGLang's prefill re-score; v2 against the decode logprobs themselves."""
    by_id = {cid: build_plan(cid, Layout()) for cid in CONTRACT_IDS}
    for plan in by_id.values():
        rescore = "--recompute-logprobs-via-prefill" in plan.trainer_command
        assert rescore == (plan.logprob_contract == "sglang_prefill")


@pytest.mark.parametrize("contract_id", CONTRACT_IDS)
def test_layout_dependent_fields(contract_id: str) -> None:
    single = build_plan(contract_id, Layout())
    layout = _admitted(contract_id, Layout(tp=2, cp=2))
    split = build_plan(contract_id, layout)
    flag = "--enforce-disable-flashinfer-allreduce-fusion"
    assert flag not in single.rollout_command and flag in split.rollout_command
    assert "--cp-comm-type" not in single.trainer_command
    engine = {r.source: r.value for r in split.engine_side}
    if layout.cp == 2:  # a contract without CP (Qwen3-Next) renders no CP flags
        assert split.trainer_command[split.trainer_command.index("--cp-comm-type") + 1] == "a2a"
    assert engine["megatron.use_ulysses_cp_recompute_fallback"] is (layout.cp == 2)
    assert engine["sglang.tp_invariant_row_linear"] is True
    assert {r.source: r.value for r in single.engine_side}[
        "sglang.tp_invariant_row_linear"
    ] is False


def test_nccl_algo_kept_from_the_environment() -> None:
    plan = build_plan(CONTRACT_IDS[0], Layout(), environ={"NCCL_ALGO": "Tree"})
    assert plan.env["NCCL_ALGO"] == "Tree"
    row = next(r for r in plan.rows if r.source == "launcher.nccl_algo")
    assert row.note == "kept from the environment (the policy's default is Ring)"


def test_unreleased_flags_are_reported_not_hidden() -> None:
    plan = build_plan(CONTRACT_IDS[0], Layout())
    assert [flag for flag, _ in plan.needs_newer_sglang] == ["--true-on-policy-contract"]
    assert to_json_data(plan)["needs_newer_sglang"][0]["sglang_release"] == "0.5.23"


def test_a_value_no_row_knows_is_refused() -> None:
    from contractgen.adapters.launcher.plan import PlanError, render_row
    from contractgen.adapters.launcher.rows import Choice
    from contractgen.adapters.launcher.tables import MEGATRON

    row = next(
        r for r in MEGATRON if isinstance(r, Choice) and r.source == "kernel.dense_math_dtype"
    )
    values = {"kernel": type("K", (), {"dense_math_dtype": "int8"})()}
    with pytest.raises(
        PlanError,
        match=r"kernel.dense_math_dtype = 'int8': no rendering for this value \(known: 'bfloat16', 'float16', 'float32'\)",
    ):
        render_row("megatron", row, values, {})


def test_a_contract_that_disables_the_launcher_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from contractgen.adapters.launcher import PlanError, plan

    real = plan.generated.runtime_policy

    def disabled(target: str):
        module = real(target)
        if target != "launcher":
            return module
        off = dataclasses.replace(module.policy_for(CONTRACT_IDS[0]), enabled=False)
        return type("M", (), {"policy_for": staticmethod(lambda cid, config=None: off)})

    monkeypatch.setattr(plan.generated, "runtime_policy", disabled)
    with pytest.raises(PlanError, match="the contract does not enable the launcher"):
        build_plan(CONTRACT_IDS[0], Layout())
