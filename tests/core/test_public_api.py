"""Issue 12: the generated modules are supersets of the public hand-kept modules' API.

Names and values below are facts recorded in PUBLIC_STACK.md (the public repos' names, aliases,
signatures and defaults), not their code.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from types import SimpleNamespace

import pytest

from .helpers import ROOT, V1_ID

GENERATED = ROOT / "generated"
PACKAGES = {
    "sglang": "python/sglang/srt/true_on_policy",
    "megatron": "miles_megatron_plugins/true_on_policy",
    "launcher": "miles/true_on_policy",
}


def _load(target: str):
    import importlib.util
    import sys
    import types

    name = f"_public_api_{target}"
    pkg = types.ModuleType(name)
    pkg.__path__ = []  # type: ignore[attr-defined]
    sys.modules[name] = pkg
    mods = {}
    try:
        for stem in ("schema", "runtime_policy", "contracts"):
            full = f"{name}.{stem}"
            spec = importlib.util.spec_from_loader(full, loader=None)
            mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            mod.__package__ = name
            sys.modules[full] = mod
            path = GENERATED / target / PACKAGES[target] / f"{stem}.py"
            exec(compile(path.read_bytes(), str(path), "exec"), mod.__dict__)
            mods[stem] = mod
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            sys.modules.pop(key)
    return SimpleNamespace(**mods)


@pytest.fixture(scope="module", params=sorted(PACKAGES))
def target(request):
    return request.param, _load(request.param)


def _args(alias) -> set[str]:
    return set(typing.get_args(alias))


def test_schema_literal_aliases_are_supersets_of_the_public_ones(target) -> None:
    _, m = target
    s = m.schema
    assert {"qwen3_dense_true_on_policy_v1", "qwen3_moe_true_on_policy_v1"} <= _args(
        s.TrueOnPolicyContractName
    )
    assert {"qwen3_dense", "qwen3_moe", "qwen3_next"} <= _args(s.ModelFamily)
    assert {"qwen3_dense_sglang_math", "qwen3_moe_sglang_math"} <= _args(s.KernelContract)
    assert {"sglang_prefill"} <= _args(s.LogprobContract)


def test_schema_dataclass_is_annotated_with_the_aliases_in_public_order(target) -> None:
    _, m = target
    fields = dataclasses.fields(m.schema.TrueOnPolicyContractSchema)
    assert [f.name for f in fields][:7] == [
        "name",
        "model_family",
        "required_kernel_contracts",
        "logprob_contract",
        "sglang_attention_backend",
        "fsdp_attention_implementation",
        "disable_megatron_sequence_parallel",
    ]
    hints = typing.get_type_hints(m.schema.TrueOnPolicyContractSchema, vars(m.schema))
    assert hints["name"] is m.schema.TrueOnPolicyContractName
    assert hints["model_family"] is m.schema.ModelFamily
    assert hints["required_kernel_contracts"] == tuple[m.schema.KernelContract, ...]
    assert hints["logprob_contract"] is m.schema.LogprobContract
    assert dataclasses.is_dataclass(m.schema.TrueOnPolicyContractSchema)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.schema.QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA.name = "x"  # type: ignore[misc]


PUBLIC_VALUES = {
    "QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA": (
        "qwen3_dense_true_on_policy_v1",
        "qwen3_dense",
        ("qwen3_dense_sglang_math",),
        "sglang_prefill",
        "fa3",
        "flash_attention_3",
        True,
    ),
    "QWEN3_MOE_TRUE_ON_POLICY_V1_SCHEMA": (
        "qwen3_moe_true_on_policy_v1",
        "qwen3_moe",
        ("qwen3_dense_sglang_math", "qwen3_moe_sglang_math"),
        "sglang_prefill",
        "fa3",
        "flash_attention_3",
        True,
    ),
}


@pytest.mark.parametrize("constant", sorted(PUBLIC_VALUES))
def test_public_identity_constants_hold_the_public_values(target, constant: str) -> None:
    _, m = target
    value = getattr(m.schema, constant)
    got = tuple(getattr(value, f.name) for f in dataclasses.fields(value))[:7]
    assert got == PUBLIC_VALUES[constant]


def test_contracts_module_re_exports_what_the_repos_import(target) -> None:
    _, m = target
    for name in ("KernelContract", "LogprobContract", "ModelFamily", "TrueOnPolicyContractName"):
        assert getattr(m.contracts, name) is getattr(m.schema, name)
    assert m.contracts.get_true_on_policy_contract is m.runtime_policy.get_true_on_policy_contract


def test_miles_contract_object_api() -> None:
    m = _load("launcher")
    contract = m.contracts.QWEN3_DENSE_TRUE_ON_POLICY_V1  # in miles: the object
    assert isinstance(contract, m.contracts.TrueOnPolicyContract)
    assert list(inspect.signature(m.contracts.get_true_on_policy_contract).parameters) == ["name"]
    assert m.contracts.get_true_on_policy_contract(name=V1_ID) is contract
    # miles' config.py: contract.kernel_policy_kwargs_for(train_backend=..., sglang_target=...)
    # with the keys of its TrueOnPolicyKernelPolicy
    params = inspect.signature(contract.kernel_policy_kwargs_for).parameters
    assert list(params) == ["train_backend", "sglang_target", "parallel_layout"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    on = contract.kernel_policy_kwargs_for(train_backend="megatron", sglang_target="fsdp_tp")
    assert on == {
        "deterministic_inference": True,
        "deterministic_training": True,
        "sglang_attention_backend": "fa3",
        "megatron_uses_sglang_backend": True,
        "disable_rope_fusion": True,
        "disable_bias_swiglu_fusion": True,
        "batch_invariant_mode": True,
        "tp_invariant_row_linear": True,
        "deterministic_tp_allreduce": True,
    }
    off = contract.kernel_policy_kwargs_for(train_backend="fsdp", sglang_target="fsdp")
    assert not any(off[k] for k in ("megatron_uses_sglang_backend", "batch_invariant_mode"))
    assert not off["tp_invariant_row_linear"] and not off["deterministic_tp_allreduce"]

    class Layout:  # miles' parallel layout: rollout TP switches the TP-invariant rollout on
        uses_train_tp, uses_rollout_tp = False, True

    by_layout = contract.kernel_policy_kwargs_for(
        train_backend="megatron", parallel_layout=Layout()
    )
    assert by_layout["tp_invariant_row_linear"] is True


def test_megatron_names_and_defaults() -> None:
    m = _load("megatron")
    rp = m.runtime_policy
    assert rp.QWEN3_DENSE_TRUE_ON_POLICY_V1 == V1_ID  # in Megatron: the id string
    assert isinstance(rp.QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT, rp.MegatronTrueOnPolicyContract)
    assert rp.DEFAULT_RUNTIME_POLICY.attention_backend == "default"
    assert list(inspect.signature(rp.MegatronTrueOnPolicyContract.policy_for).parameters) == [
        "self",
        "config",
    ]
    # the public parameter name: validate_true_on_policy_contract(contract_name=...) keeps working
    assert list(inspect.signature(rp.validate_true_on_policy_contract).parameters) == [
        "contract_name"
    ]
    rp.validate_true_on_policy_contract(contract_name=V1_ID)
    with pytest.raises(ValueError, match="^Unsupported Megatron true-on-policy contract 'nope_v1'"):
        rp.validate_true_on_policy_contract(contract_name="nope_v1")
    assert list(inspect.signature(rp.get_true_on_policy_contract).parameters) == ["contract_name"]
    assert len(dataclasses.fields(rp.MegatronTrueOnPolicyRuntimePolicy)) >= 18


def test_sglang_policy_takes_server_args() -> None:
    m = _load("sglang")
    rp = m.runtime_policy
    assert rp.QWEN3_DENSE_TRUE_ON_POLICY_V1 == V1_ID
    assert "server_args" in inspect.signature(rp.SGLangTrueOnPolicyContract.policy_for).parameters
    assert list(inspect.signature(rp.resolve_true_on_policy_runtime_policy).parameters) == [
        "server_args"
    ]
    policy = rp.QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT.policy_for(
        server_args=SimpleNamespace(tp_size=2)
    )
    assert policy.tp_invariant_row_linear is True
    assert len(dataclasses.fields(rp.SGLangTrueOnPolicyRuntimePolicy)) >= 10


def test_a_contract_with_a_public_identity_id_takes_the_constant_over(tmp_path) -> None:
    from contractgen.codegen.render import render
    from contractgen.project import open_project

    from .helpers import make_project

    root = make_project(tmp_path / "p")
    text = (root / "contracts" / f"{V1_ID}.yaml").read_text()
    moe = "qwen3_moe_true_on_policy_v1"
    # family stays qwen3_dense: a family is a module in adapters/families/, and the dense one is
    # enough to show the contract's identity replacing the public constant
    text = text.replace(f"id: {V1_ID}", f"id: {moe}")
    (root / "contracts" / f"{moe}.yaml").write_text(text)
    project = open_project(root)
    schema = render(project.contracts, project.config)[
        f"sglang/{PACKAGES['sglang']}/schema.py"
    ].decode()
    assert schema.count("QWEN3_MOE_TRUE_ON_POLICY_V1_SCHEMA = ") == 1
    assert f'"{moe}",' in schema.split("CONTRACT_IDS")[1].split("\n\n")[0]  # now a real contract
