"""Rendered Megatron settings against the real megatron-core: build a TransformerConfig from them.

Each Megatron/miles table row names the TransformerConfig fields its flag sets; a renamed or
removed field, or a combination megatron-core's own ``__post_init__`` refuses (batch-invariant
mode without the flash backend, heads not divisible by TP, ...), fails here. CPU only.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from contractgen.adapters.launcher import Layout, build_plan
from contractgen.adapters.launcher.tables import MEGATRON, MILES
from contractgen.codegen.vendored import load_target

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    transformer = pytest.importorskip("megatron.core.transformer")
    enums = pytest.importorskip("megatron.core.transformer.enums")

TransformerConfig = transformer.TransformerConfig
CONFIG_FIELDS = {f.name for f in dataclasses.fields(TransformerConfig)}
# the cases below name Qwen3 checkpoints; Llama 3 layouts: test_llama3_layouts.py
CONTRACT_IDS = tuple(
    cid
    for cid in load_target("launcher").schema.CONTRACT_IDS
    if load_target("launcher").schema.model_profile_for(cid).family == "qwen3_dense"
)

# Trainer flags that set no TransformerConfig field, and where they act instead.
NOT_CONFIG = {
    "--make-vocab-size-divisible-by": "megatron.training pads the vocab when it builds the model",
    "--rollout-num-gpus-per-engine": "miles: sizes the SGLang engines",
    "--true-on-policy-mode": "miles: trains on the rollout logprobs",
    "--recompute-logprobs-via-prefill": "miles: re-scores the rollout with one prefill",
}

# TransformerConfig fields whose values are not plain Python values on the command line.
CONVERT = {
    "params_dtype": lambda v: getattr(torch, v),
    "pipeline_dtype": lambda v: getattr(torch, v),
    "attention_backend": lambda v: enums.AttnBackend[v],
}

LAYOUTS = [
    ("Qwen3-0.6B", Layout()),
    ("Qwen3-0.6B", Layout(tp=2, cp=2, dp=2)),
    ("Qwen3-4B", Layout(tp=4, pp=2)),
    ("Qwen3-32B", Layout(tp=8, pp=4, cp=1)),
    ("reference", Layout(cp=2, pp=2)),
    ("reference", Layout(tp=2)),
    ("reference", Layout(tp=2, cp=2)),  # KV heads replicated over the CP ranks
    ("Qwen3-32B", Layout(tp=8, cp=4)),
]


def _config_kwargs(plan) -> tuple[dict, dict]:
    released, fork_only = {}, {}
    for row in plan.rows:
        if row.table not in ("megatron", "miles") or row.kind != "arg" or not row.emitted:
            continue
        if not row.config:
            assert row.args[0] in NOT_CONFIG, f"{row.args[0]} sets no TransformerConfig field"
        for name, value in row.config:
            (fork_only if row.fork_only else released)[name] = CONVERT.get(name, lambda v: v)(value)
    return released, fork_only


def _model_kwargs(dims) -> dict:
    return {
        "num_layers": dims.num_layers,
        "hidden_size": dims.hidden_size,
        "num_attention_heads": dims.num_attention_heads,
        "num_query_groups": dims.num_kv_heads,
        "kv_channels": dims.head_dim,
        "ffn_hidden_size": dims.intermediate_size,
    }


def test_table_config_fields_exist_in_megatron_core() -> None:
    """Released rows name real fields; fork-only rows name fields released megatron-core lacks."""
    for row in (*MEGATRON, *MILES):
        config = getattr(row, "config", ())
        pairs = config.values() if isinstance(config, dict) else (config,)
        names = {name for group in pairs for name, _ in group}
        if getattr(row, "fork_only", False):
            assert not names & CONFIG_FIELDS, f"{row.source}: {names} is in megatron-core now"
        else:
            assert names <= CONFIG_FIELDS, f"{row.source}: {names - CONFIG_FIELDS}"


@pytest.mark.parametrize("contract_id", CONTRACT_IDS)
@pytest.mark.parametrize(("model", "layout"), LAYOUTS, ids=str)
def test_rendered_args_build_a_real_transformer_config(
    contract_id: str, model: str, layout: Layout
) -> None:
    plan = build_plan(contract_id, layout, model)
    released, fork_only = _config_kwargs(plan)
    assert fork_only == {"true_on_policy_contract": contract_id}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = TransformerConfig(**_model_kwargs(plan.model), **released)
    for name, value in released.items():
        assert getattr(config, name) == value, name
    assert config.sequence_parallel is False  # the contract forbids --sequence-parallel
    assert config.tensor_model_parallel_size == layout.tp
    assert config.context_parallel_size == layout.cp
    assert config.cp_comm_type == ("a2a" if layout.cp > 1 else None)
    assert config.batch_invariant_mode and config.deterministic_mode
    assert config.transformer_impl == "local" and config.use_cpu_initialization
    assert not config.apply_rope_fusion and not config.bias_activation_fusion


# Megatron-LM's own hand-written flags among ours (checked against megatron/training/arguments.py
# at tag core_v0.16.1); every other flag there is generated from a TransformerConfig field by
# ArgumentGroupFactory as ``--<field-with-dashes>``.
HAND_WRITTEN_FLAGS = {
    "--no-rope-fusion": "apply_rope_fusion",
    "--no-bias-swiglu-fusion": "bias_activation_fusion",
    "--bf16": "bf16",
}


def test_flag_names_follow_megatron_lm() -> None:
    """A flag that sets a TransformerConfig field is that field's generated Megatron-LM name."""
    for row in (*MEGATRON, *MILES):
        flag, config = getattr(row, "flag", None), getattr(row, "config", ())
        if flag is None or not config or getattr(row, "fork_only", False):
            continue
        field = config[0][0]
        expected = HAND_WRITTEN_FLAGS.get(flag) == field or flag == "--" + field.replace("_", "-")
        assert expected, f"{row.source}: {flag} does not set {field} in Megatron-LM"


def test_megatron_core_defaults_are_refused_and_the_plan_turns_dropout_off() -> None:
    """Issue 31: a real TransformerConfig with megatron-core's defaults (attention and hidden
    dropout 0.1) is refused by the plan's validation; the one built from the rendered args is not,
    and turning one dropout back on is named."""
    plan = build_plan(CONTRACT_IDS[0], Layout(tp=2), "Qwen3-0.6B")
    released, _ = _config_kwargs(plan)
    assert released["attention_dropout"] == 0.0 and released["hidden_dropout"] == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        default = TransformerConfig(**_model_kwargs(plan.model))
        rendered = TransformerConfig(**_model_kwargs(plan.model), **released)
        again = TransformerConfig(
            **_model_kwargs(plan.model), **{**released, "hidden_dropout": 0.1}
        )
    problems = plan.trainer_config_conflicts(default)
    assert (
        "attention_dropout=0.1: the plan sets attention_dropout=0.0 (--attention-dropout)"
        in problems
    )
    assert "hidden_dropout=0.1: the plan sets hidden_dropout=0.0 (--hidden-dropout)" in problems
    assert plan.trainer_config_conflicts(rendered) == []
    assert plan.trainer_config_conflicts(again) == [
        "hidden_dropout=0.1: the plan sets hidden_dropout=0.0 (--hidden-dropout)"
    ]
