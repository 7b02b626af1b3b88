"""Baseline of the generated public surface: the names and values of the public three-repo stack
(radixark/miles, radixark/Megatron-LM miles-main, sgl-project/sglang sglang-miles; see
shared/PUBLIC_STACK.md), so the generated modules can replace the hand-kept ones."""

from __future__ import annotations

import dataclasses
import typing
from types import SimpleNamespace

import pytest

from .helpers import PACKAGES, ROOT, V1_ID, files_under, load_rendered_package


def _load(target: str):
    return load_rendered_package(
        files_under(ROOT / "generated" / target / PACKAGES[target]), f"_cg_compat_{target}"
    )


@pytest.fixture(scope="module")
def sglang():
    return _load("sglang")


@pytest.fixture(scope="module")
def megatron():
    return _load("megatron")


@pytest.fixture(scope="module")
def launcher():
    return _load("launcher")


PUBLIC_SCHEMA_FIELDS = [
    "name",
    "model_family",
    "required_kernel_contracts",
    "logprob_contract",
    "sglang_attention_backend",
    "fsdp_attention_implementation",
    "disable_megatron_sequence_parallel",
]

MEGATRON_FIELDS = [
    "contract_name",
    "enabled",
    "use_sglang_backend",
    "batch_invariant_mode",
    "disable_rope_fusion",
    "disable_bias_swiglu_fusion",
    "attention_backend",
    "cp_layout",
    "cast_attention_input_to_dense_math_dtype",
    "cast_qk_norm_input_before_weight_mul",
    "cast_qk_after_rope_to_dense_math_dtype",
    "cast_lm_head_input_to_weight_dtype",
    "deterministic_row_parallel_reduce",
    "defer_ulysses_cp_loss_scaling_to_grad_sum",
    "apply_logits_contract",
    "use_sglang_final_norm",
    "use_sglang_residual_pair",
    "use_ulysses_cp_recompute_fallback",
]

SGLANG_FIELDS = [
    "contract_name",
    "enabled",
    "force_bfloat16_dense_tensor_math",
    "force_bfloat16_lm_head",
    "disable_reduce_scatter",
    "disable_mlp_allreduce_fusion",
    "disable_flashinfer_allreduce_fusion",
    "tp_invariant_row_linear",
    "deterministic_tree_all_reduce",
    "disable_fused_qk_norm_mrope",
]


def _names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


# --------------------------------------------------------------------------------------------
# schema.py


def test_schema_dataclass_public_fields_in_order(sglang) -> None:
    schema, _ = sglang
    fields = _names(schema.TrueOnPolicyContractSchema)
    assert fields[:7] == PUBLIC_SCHEMA_FIELDS
    assert fields[7:] == ["schema_version", "fingerprint", "supersedes"]
    assert schema.TrueOnPolicyContractSchema.__dataclass_params__.frozen


def test_v1_schema_values(sglang) -> None:
    schema, _ = sglang
    v1 = schema.QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA
    public = {
        "name": "qwen3_dense_true_on_policy_v1",
        "model_family": "qwen3_dense",
        "required_kernel_contracts": ("qwen3_dense_sglang_math",),
        "logprob_contract": "sglang_prefill",
        "sglang_attention_backend": "fa3",
        "fsdp_attention_implementation": "flash_attention_3",
        "disable_megatron_sequence_parallel": True,
    }
    assert {k: getattr(v1, k) for k in public} == public
    assert type(v1.required_kernel_contracts) is tuple
    assert v1.disable_megatron_sequence_parallel is True
    assert v1.supersedes is None
    assert v1.fingerprint == schema.FINGERPRINTS[V1_ID]
    assert schema.get_contract_schema(V1_ID) is v1


def test_literal_aliases_cover_the_public_values(sglang) -> None:
    schema, _ = sglang
    assert "qwen3_dense_true_on_policy_v1" in typing.get_args(schema.TrueOnPolicyContractName)
    assert "qwen3_dense" in typing.get_args(schema.ModelFamily)
    assert "qwen3_dense_sglang_math" in typing.get_args(schema.KernelContract)
    assert "sglang_prefill" in typing.get_args(schema.LogprobContract)
    assert schema.CONTRACT_IDS == tuple(sorted(schema.CONTRACT_IDS))


def test_v1_kernel_policy_is_the_public_v1_numerics(sglang) -> None:
    schema, _ = sglang
    kp = schema.kernel_policy_for(V1_ID)
    assert kp.logsoftmax_dtype == "bfloat16"
    assert kp.matmul_tile_order == "sglang_first_level"
    assert kp.matmul_k_block == 128
    assert kp.all_reduce == "fixed_tree"
    assert kp.dense_math_dtype == "bfloat16"
    assert schema.first_level_block(38) == 19  # Qwen3-4B down_proj at TP=2
    assert schema.first_level_block(32) == 2
    par = schema.parallel_support_for(V1_ID)
    assert par.train_tp_sizes == (1, 2, 4, 8) and par.rollout_tp_sizes == (1, 2, 4, 8)
    assert par.train_cp_kind == "ulysses"
    assert par.sequence_parallel is False


@pytest.mark.parametrize(
    "lookup", ["get_contract_schema", "kernel_policy_for", "model_profile_for"]
)
def test_schema_unknown_id_lists_known(sglang, lookup: str) -> None:
    schema, _ = sglang
    with pytest.raises(KeyError) as info:
        getattr(schema, lookup)("qwen3_dense_true_on_policy_v9")
    assert str(info.value) == (
        "unknown true-on-policy contract 'qwen3_dense_true_on_policy_v9'; known: "
        "llama3_dense_lora_true_on_policy_v1, llama3_dense_true_on_policy_v1, "
        "llama3_dense_true_on_policy_v2, qwen3_dense_lora_true_on_policy_v1, "
        "qwen3_dense_true_on_policy_v1, qwen3_dense_true_on_policy_v2, qwen3_dense_true_on_policy_v3, "
        "qwen3_dense_true_on_policy_v4, qwen3_moe_true_on_policy_v1, qwen3_moe_true_on_policy_v2, qwen3_moe_true_on_policy_v3, "
        "qwen3_next_true_on_policy_v1"
    )
    assert isinstance(info.value, ValueError)


# --------------------------------------------------------------------------------------------
# Megatron runtime policy


def _mcfg(tp=1, cp=1, comm=None, bim=False):
    return SimpleNamespace(
        tensor_model_parallel_size=tp,
        context_parallel_size=cp,
        cp_comm_type=comm,
        batch_invariant_mode=bim,
    )


def test_megatron_fields_in_public_order(megatron) -> None:
    _, rp = megatron
    assert _names(rp.MegatronTrueOnPolicyRuntimePolicy) == MEGATRON_FIELDS
    assert len(MEGATRON_FIELDS) == 18


def test_megatron_v1_values(megatron) -> None:
    _, rp = megatron
    policy = rp.policy_for(V1_ID, _mcfg(tp=2, bim=True))
    assert dataclasses.asdict(policy) == {
        "contract_name": V1_ID,
        "enabled": True,
        "use_sglang_backend": True,
        "batch_invariant_mode": True,
        "disable_rope_fusion": True,
        "disable_bias_swiglu_fusion": True,
        "attention_backend": "fa3_varlen",
        "cp_layout": None,
        "cast_attention_input_to_dense_math_dtype": True,
        "cast_qk_norm_input_before_weight_mul": True,
        "cast_qk_after_rope_to_dense_math_dtype": True,
        "cast_lm_head_input_to_weight_dtype": True,
        "deterministic_row_parallel_reduce": True,
        "defer_ulysses_cp_loss_scaling_to_grad_sum": True,
        "apply_logits_contract": True,
        "use_sglang_final_norm": True,
        "use_sglang_residual_pair": True,
        "use_ulysses_cp_recompute_fallback": False,
    }


@pytest.mark.parametrize(
    ("cp", "comm", "ulysses"),
    [
        (1, None, False),
        (1, "a2a", False),
        (2, "a2a", True),
        (4, ["a2a"], True),
        (2, ["a2a", "a2a"], True),
        # megatron-core: a list is one comm type per layer. As the public Megatron module reads
        # it (issue 30), any a2a entry selects the Ulysses layout. A tuple is refused by
        # TransformerConfig at CP > 1: no layout (as public).
        (2, ["p2p", "a2a"], True),
        (2, ["a2a", "p2p"], True),
        (2, ["p2p", "p2p"], False),
        (2, ("a2a",), False),
        (2, "p2p", False),
        (2, None, False),
        (2, "allgather", False),
    ],
)
def test_megatron_ulysses_fields_only_under_cp_with_a2a(megatron, cp, comm, ulysses) -> None:
    _, rp = megatron
    policy = rp.policy_for(V1_ID, _mcfg(cp=cp, comm=comm))
    assert policy.cp_layout == ("ulysses_a2a" if ulysses else None)
    assert policy.use_ulysses_cp_recompute_fallback is ulysses


@pytest.mark.parametrize("bim", [True, False])
def test_megatron_batch_invariant_mode_copied_from_config(megatron, bim: bool) -> None:
    _, rp = megatron
    assert rp.policy_for(V1_ID, _mcfg(bim=bim)).batch_invariant_mode is bim
    no_attr = SimpleNamespace(tensor_model_parallel_size=1)
    assert rp.policy_for(V1_ID, no_attr).batch_invariant_mode is False


def test_megatron_contract_object_and_string_constant(megatron) -> None:
    schema, rp = megatron
    assert rp.QWEN3_DENSE_TRUE_ON_POLICY_V1 == "qwen3_dense_true_on_policy_v1"
    assert isinstance(rp.QWEN3_DENSE_TRUE_ON_POLICY_V1, str)
    contract = rp.QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT
    assert isinstance(contract, rp.MegatronTrueOnPolicyContract)
    assert contract.schema is schema.QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA
    assert contract.name == V1_ID
    assert rp.get_true_on_policy_contract(V1_ID) is contract
    assert contract.policy_for(_mcfg()) == rp.policy_for(V1_ID, _mcfg())


def test_megatron_default_policy_is_the_public_default(megatron) -> None:
    _, rp = megatron
    default = dataclasses.asdict(rp.DEFAULT_RUNTIME_POLICY)
    public = {name: False for name in MEGATRON_FIELDS}
    public.update(contract_name=None, cp_layout=None, cast_qk_norm_input_before_weight_mul=True)
    public["attention_backend"] = "default"  # as the public module has it (issue 12)
    assert default == public
    assert rp.resolve_true_on_policy_runtime_policy(SimpleNamespace()) is rp.DEFAULT_RUNTIME_POLICY
    named = SimpleNamespace(true_on_policy_contract=V1_ID, **vars(_mcfg()))
    assert rp.resolve_true_on_policy_runtime_policy(named).enabled is True


# --------------------------------------------------------------------------------------------
# SGLang runtime policy


def test_sglang_fields_in_public_order(sglang) -> None:
    _, rp = sglang
    assert _names(rp.SGLangTrueOnPolicyRuntimePolicy) == SGLANG_FIELDS


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_sglang_v1_values(sglang, tp: int) -> None:
    _, rp = sglang
    policy = rp.policy_for(V1_ID, SimpleNamespace(tp_size=tp))
    multi = tp > 1
    assert dataclasses.asdict(policy) == {
        "contract_name": V1_ID,
        "enabled": True,
        "force_bfloat16_dense_tensor_math": True,
        "force_bfloat16_lm_head": True,
        "disable_reduce_scatter": True,
        "disable_mlp_allreduce_fusion": True,
        "disable_flashinfer_allreduce_fusion": multi,
        "tp_invariant_row_linear": multi,
        "deterministic_tree_all_reduce": multi,
        "disable_fused_qk_norm_mrope": True,
    }


def test_sglang_default_and_constants(sglang) -> None:
    schema, rp = sglang
    assert dataclasses.asdict(rp.DEFAULT_RUNTIME_POLICY) == {
        name: (None if name == "contract_name" else False) for name in SGLANG_FIELDS
    }
    assert rp.QWEN3_DENSE_TRUE_ON_POLICY_V1 == V1_ID
    assert (
        rp.QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT.schema is schema.QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA
    )
    assert isinstance(rp.QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT, rp.SGLangTrueOnPolicyContract)


# --------------------------------------------------------------------------------------------
# Launcher (miles): the naming trap


def test_launcher_bare_constant_is_the_contract_object(launcher) -> None:
    schema, rp = launcher
    v1 = rp.QWEN3_DENSE_TRUE_ON_POLICY_V1
    assert not isinstance(v1, str)
    assert isinstance(v1, rp.TrueOnPolicyContract)  # miles' class name
    assert rp.TrueOnPolicyContract is rp.LauncherTrueOnPolicyContract
    assert v1 is rp.QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT
    assert v1.schema is schema.QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA
    # miles' TrueOnPolicyContract forwards the identity fields as properties
    for name in PUBLIC_SCHEMA_FIELDS:
        assert getattr(v1, name) == getattr(schema.QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA, name)
    assert rp.get_true_on_policy_contract(v1.name) is v1


def test_launcher_v1_values(launcher) -> None:
    _, rp = launcher
    policy = rp.policy_for(V1_ID)
    assert policy.enabled and policy.enable_deterministic_inference
    assert policy.transformer_impl == "local"
    assert policy.nccl_algo == "Ring"
    assert policy.cublas_workspace_config == ":4096:8"
    assert policy.nvte_allow_nondeterministic_algo is False
    assert policy.recompute_logprobs_via_prefill is True
    assert policy.batch_invariant_mode and policy.no_bias_swiglu_fusion and policy.no_rope_fusion


# --------------------------------------------------------------------------------------------
# All targets: registry lookups


# How each public module words the refusal (read from the public sources, issue 30).
PUBLIC_UNSUPPORTED = {
    "sglang": "Unsupported SGLang true-on-policy contract",
    "megatron": "Unsupported Megatron true-on-policy contract",
    "launcher": "Unsupported true-on-policy contract",
    "fsdp": "Unsupported FSDP true-on-policy contract",  # miles' FSDP path has no module of its own
}


@pytest.mark.parametrize("target", sorted(PACKAGES))
def test_get_true_on_policy_contract_unknown_id_lists_known(target: str) -> None:
    schema, rp = _load(target)
    for call in (
        rp.get_true_on_policy_contract,
        rp.policy_for,
        rp.validate_true_on_policy_contract,
    ):
        with pytest.raises(KeyError) as info:
            call("nope_v1")
        message = str(info.value)
        assert message.startswith(f"{PUBLIC_UNSUPPORTED[target]} 'nope_v1'. Supported contracts: ")
        assert "qwen3_dense_true_on_policy_v1, qwen3_dense_true_on_policy_v2" in message
        # the public modules raise ValueError: callers catching it keep working
        assert isinstance(info.value, ValueError)
    rp.validate_true_on_policy_contract(None)
    assert rp.QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT.name == V1_ID
    assert set(rp.__all__) <= set(dir(rp))
    assert schema.SCHEMA_VERSION == 1


def test_runtime_policies_are_frozen(sglang) -> None:
    _, rp = sglang
    policy = rp.policy_for(V1_ID, SimpleNamespace(tp_size=2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.enabled = False  # type: ignore[misc]


@pytest.mark.parametrize("target", sorted(PACKAGES))
def test_validate_takes_an_id_or_a_config(target: str) -> None:
    """Megatron's public validate takes the id, SGLang's takes server_args: both work."""
    _, rp = _load(target)
    rp.validate_true_on_policy_contract(V1_ID)
    rp.validate_true_on_policy_contract(None)
    rp.validate_true_on_policy_contract(SimpleNamespace(true_on_policy_contract=V1_ID))
    rp.validate_true_on_policy_contract(SimpleNamespace(true_on_policy_contract=None))
    rp.validate_true_on_policy_contract(SimpleNamespace())
    with pytest.raises(ValueError, match="'nope_v1'"):
        rp.validate_true_on_policy_contract(SimpleNamespace(true_on_policy_contract="nope_v1"))
