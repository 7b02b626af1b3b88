"""Issue 32: ``matmul_column_k_runs`` (v4) is a contract field with its own refusals, each a
``file:line:col: field: message`` line; the contracts written before it carry no such key (their
fingerprints do not move)."""

from __future__ import annotations

import pytest

from contractgen.schema.errors import ContractError
from contractgen.schema.loader import parse_contract

from .helpers import ROOT

V4 = "contracts/qwen3_dense_true_on_policy_v4.yaml"
MOE3 = "contracts/qwen3_moe_true_on_policy_v3.yaml"
V2 = "contracts/qwen3_dense_true_on_policy_v2.yaml"


def _problems(text: str, file: str) -> list[str]:
    with pytest.raises(ContractError) as info:
        parse_contract(text.encode(), file)
    return [str(p) for p in info.value.problems]


def test_v4_loads_and_no_other_contract_carries_the_field() -> None:
    kp = parse_contract((ROOT / V4).read_bytes(), V4).model_dump(mode="json")["kernel_policy"]
    assert (kp["matmul_tile_order"], kp["matmul_k_runs"], kp["matmul_column_k_runs"]) == (
        "fixed_runs",
        8,
        1,
    )
    for path in sorted((ROOT / "contracts").glob("*.yaml")):
        if path.name != V4.split("/")[-1]:
            other = parse_contract(path.read_bytes(), str(path)).model_dump(mode="json")
            assert "matmul_column_k_runs" not in other["kernel_policy"], path.name


def test_column_runs_must_be_a_power_of_two() -> None:
    text = (ROOT / V4).read_text().replace("matmul_column_k_runs: 1", "matmul_column_k_runs: 3")
    got = _problems(text, V4)
    assert len(got) == 1, got
    assert "kernel_policy.matmul_column_k_runs: must be a power of two (got 3; nearest: " in got[0]


def test_column_runs_is_only_read_by_fixed_runs() -> None:
    text = (ROOT / V2).read_text()
    text = text.replace("  all_reduce: fixed_tree\n", "  all_reduce: fixed_tree\n  matmul_column_k_runs: 1\n", 1)  # fmt: skip
    got = _problems(text, V2)
    assert len(got) == 1 and got[0].endswith(
        "kernel_policy.matmul_column_k_runs: is only read by matmul_tile_order 'fixed_runs' "
        "(got 'sglang_first_level'); remove it"
    ), got


def test_column_runs_is_refused_for_an_moe_family() -> None:
    text = (ROOT / MOE3).read_text().replace("  matmul_k_runs: 8\n", "  matmul_k_runs: 8\n  matmul_column_k_runs: 1\n")  # fmt: skip
    got = _problems(text, MOE3)
    assert len(got) == 1 and "kernel_policy.matmul_column_k_runs: is not supported for family 'qwen3_moe' yet" in got[0], got  # fmt: skip


def test_a_column_k_must_be_whole_column_runs() -> None:
    """hidden 512 is 8 tiles of 64: 16 column runs cannot be whole tiles (the row-parallel Ks keep
    matmul_k_runs: 8 and pass)."""
    text = (ROOT / V4).read_text().replace("matmul_column_k_runs: 1", "matmul_column_k_runs: 16")
    got = _problems(text, V4)
    assert got and all("16 runs of whole 64-wide tiles" in g for g in got), got
    assert any("reference_model.hidden_size" in g for g in got), got
    assert not any("intermediate_size" in g for g in got), got  # down_proj is row: 8 runs
