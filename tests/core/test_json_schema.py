"""The exported JSON Schema: committed, 2020-12 with an ``$id``, and in agreement with pydantic.

JSON Schema checks structure only. Rules that relate fields (divisibility, tile subtrees,
power-of-two TP, runtime vs kernel policy) are beyond it and live in ``schema/rules.py``; a file
can satisfy the JSON Schema and still be rejected by contractgen (tested below).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from contractgen.schema.errors import ContractError
from contractgen.schema.export import SCHEMA_FILE, contract_json_schema, schema_json
from contractgen.schema.loader import parse_contract
from contractgen.schema.models import Contract

from .helpers import CONTRACTS, ROOT, V1_YAML, cli

SCHEMA = contract_json_schema()
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
V1 = yaml.safe_load(V1_YAML.read_text())


def _pydantic_ok(data: dict) -> bool:
    try:
        Contract.model_validate_json(json.dumps(data), strict=True)
    except ValidationError:
        return False
    return True


def _jsonschema_ok(data: dict) -> bool:
    return VALIDATOR.is_valid(data)


def test_committed_schema_equals_export() -> None:
    assert SCHEMA_FILE.read_text() == schema_json(), (
        "schema/contract.schema.json is stale: run "
        "`.venv/bin/contractgen schema > schema/contract.schema.json`"
    )


def test_schema_command_prints_the_committed_file() -> None:
    result = cli("schema")
    assert result.exit_code == 0
    assert result.output == (ROOT / "schema" / "contract.schema.json").read_text()


def test_schema_identity() -> None:
    data = json.loads(SCHEMA_FILE.read_text())
    assert data["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert data["$id"].startswith("https://") and data["$id"].endswith("contract.schema.json")
    assert "beyond JSON Schema" in data["$comment"]
    jsonschema.Draft202012Validator.check_schema(data)
    assert data["additionalProperties"] is False


@pytest.mark.parametrize("path", sorted(CONTRACTS.glob("*.yaml")), ids=lambda p: p.name)
def test_contract_files_point_editors_at_the_schema(path: Path) -> None:
    """``# yaml-language-server: $schema=…`` on line 1, resolving to the committed schema."""
    first = path.read_text().splitlines()[0]
    prefix = "# yaml-language-server: $schema="
    assert first.startswith(prefix), first
    target = (path.parent / first[len(prefix) :]).resolve()
    assert target == SCHEMA_FILE.resolve()


@pytest.mark.parametrize("path", sorted(CONTRACTS.glob("*.yaml")), ids=lambda p: p.name)
def test_good_contracts_valid_in_both(path: Path) -> None:
    data = yaml.safe_load(path.read_text())
    assert _jsonschema_ok(data), [e.message for e in VALIDATOR.iter_errors(data)]
    assert _pydantic_ok(data)


def _set(path: str, value: object) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        *parents, last = path.split(".")
        node = data
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value

    return edit


def _delete(path: str) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        *parents, last = path.split(".")
        node = data
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        del node[last]

    return edit


STRUCTURAL_BAD = {
    "unknown_top_level": _set("extra", 1),
    "unknown_nested": _set("kernel_policy.matmul_k_blok", 128),
    "unknown_in_when": _set(
        "runtime_policy.sglang.tp_invariant_row_linear", {"when": "rollout_tp", "x": 1}
    ),
    "missing_top_level": _delete("identity"),
    "missing_nested": _delete("kernel_policy.logsoftmax_dtype"),
    "missing_in_checkpoint": _delete("model_profile.checkpoints.0.head_dim"),
    "string_for_int": _set("kernel_policy.matmul_k_block", "128"),
    "bool_for_int": _set("kernel_policy.matmul_k_block", True),
    "fraction_for_int": _set("kernel_policy.matmul_k_block", 1.5),
    "zero_for_positive": _set("kernel_policy.attention_kv_chunk", 0),
    "int_for_bool": _set("model_profile.qk_norm", 1),
    "string_for_bool": _set("parallel.training.dp", "yes"),
    "bad_enum": _set("kernel_policy.logsoftmax_dtype", "float64"),
    "bad_tile_order": _set("kernel_policy.matmul_tile_order", "random"),
    "bad_id_pattern": _set("id", "Qwen3-v1"),
    "id_without_version": _set("id", "qwen3_dense"),
    "bad_identifier": _set("family", "Qwen3 Dense"),
    "empty_description": _set("description", ""),
    "empty_kernel_contracts": _set("identity.kernel_contracts", []),
    "list_for_mapping": _set("kernel_policy", []),
    "null_for_required": _set("kernel_policy.rope_dtype", None),
    "schema_version_2": _set("schema_version", 2),
    "eps_out_of_range": _set("model_profile.norm.eps", 2.0),
    "bad_when_condition": _set("runtime_policy.sglang.tp_invariant_row_linear", {"when": "pp"}),
    "bad_nccl_algo": _set("runtime_policy.launcher.nccl_algo", "Ring; rm -rf /"),
    "bad_cublas_config": _set("runtime_policy.launcher.cublas_workspace_config", "4096:8"),
    "tp_sizes_not_list": _set("parallel.training.tp", 2),
    "tp_size_zero": _set("parallel.training.tp", [0, 1]),
    "bad_cp_kind": _set("parallel.training.cp.kind", "ring"),
    "transformer_impl": _set("runtime_policy.launcher.transformer_impl", "te"),
    "from_config_extra": _set(
        "runtime_policy.megatron.batch_invariant_mode", {"from_config": "x", "y": 1}
    ),
}


@pytest.mark.parametrize("case", sorted(STRUCTURAL_BAD))
def test_structurally_bad_rejected_by_both(case: str) -> None:
    data = copy.deepcopy(V1)
    STRUCTURAL_BAD[case](data)
    assert not _pydantic_ok(data), "pydantic accepted it"
    assert not _jsonschema_ok(data), "jsonschema accepted it"


STRUCTURAL_GOOD = {
    "int_for_float": _set("model_profile.rope.theta", 1000000),
    "optional_omitted": _delete("supersedes"),
    "tp_sizes_omitted": _delete("model_profile.checkpoints.2.tp_sizes"),
    "when_with_defaults": _set(
        "runtime_policy.sglang.disable_reduce_scatter", {"when": "rollout_tp"}
    ),
    "rope_scaling": _set("model_profile.rope.scaling", {"type": "yarn", "factor": 4.0}),
    "nccl_algo_null": _set("runtime_policy.launcher.nccl_algo", None),
}


@pytest.mark.parametrize("case", sorted(STRUCTURAL_GOOD))
def test_structurally_good_accepted_by_both(case: str) -> None:
    data = copy.deepcopy(V1)
    STRUCTURAL_GOOD[case](data)
    assert _jsonschema_ok(data), [e.message for e in VALIDATOR.iter_errors(data)]
    assert _pydantic_ok(data)


# Known, documented differences: in both, contractgen (pydantic) is the stricter side.
KNOWN_DIFFERENCES = {
    # JSON has one number type: 2020-12 calls 128.0 an integer. YAML `128.0` is a float, and
    # pydantic's strict mode refuses a float where an integer is declared.
    "integral_float_for_int": _set("kernel_policy.matmul_k_block", 128.0),
    # Python's `re` lets `$` match before a trailing newline; the jsonschema library uses it.
    # Editors (ECMA-262 regex) and pydantic (Rust regex) do not.
    "trailing_newline_in_identifier": _set("family", "qwen3_dense\n"),
}


@pytest.mark.parametrize("case", sorted(KNOWN_DIFFERENCES))
def test_known_differences_pydantic_is_stricter(case: str) -> None:
    data = copy.deepcopy(V1)
    KNOWN_DIFFERENCES[case](data)
    assert not _pydantic_ok(data)
    assert _jsonschema_ok(data), "jsonschema now rejects it too: move the case to STRUCTURAL_BAD"


CROSS_FIELD_BAD = {
    "kv_heads_not_dividing": (
        _set("model_profile.checkpoints.0.num_kv_heads", 5),
        "num_kv_heads: must divide",
    ),
    "tp_not_power_of_two": (_set("parallel.rollout.tp", [1, 2, 3]), "is not a power of two"),
    "runtime_vs_kernel": (
        _set("runtime_policy.megatron.deterministic_row_parallel_reduce", False),
        "must be true when kernel_policy.all_reduce is 'fixed_tree'",
    ),
    "k_not_whole_tiles": (
        _delete("model_profile.checkpoints.2.tp_sizes"),
        "does not split into whole",
    ),
    "pp_not_dividing_layers": (_set("parallel.training.pp", [1, 3]), "PP=3 must divide num_layers"),
    "sizes_unsorted": (_set("parallel.training.cp.sizes", [2, 1]), "must be sorted"),
}


@pytest.mark.parametrize("case", sorted(CROSS_FIELD_BAD))
def test_cross_field_rules_are_beyond_json_schema(case: str) -> None:
    """These pass the JSON Schema (and pydantic's structure) but contractgen rejects them."""
    data = copy.deepcopy(V1)
    edit, message = CROSS_FIELD_BAD[case]
    edit(data)
    assert _jsonschema_ok(data)
    assert _pydantic_ok(data)
    with pytest.raises(ContractError) as info:
        parse_contract(yaml.safe_dump(data).encode(), "c.yaml")
    assert message in str(info.value)
