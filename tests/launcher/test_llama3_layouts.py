"""Llama 3 layouts, from the family's row-parallel linears and each checkpoint's own sizes."""

from __future__ import annotations

import pytest

from contractgen.adapters.families import family_for
from contractgen.adapters.launcher.layout import Layout, LayoutError, validate_layout
from contractgen.codegen.vendored import load_target

LLAMA = "llama3_dense_true_on_policy_v1"


@pytest.mark.parametrize(
    "model",
    ["Meta-Llama-3-8B", "Llama-3.1-70B", "Llama-3.1-405B", "Llama-3.2-1B", "Llama-3.2-3B",
     "Llama-3.3-70B-Instruct"],
)  # fmt: skip
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_every_llama_checkpoint_splits_at_every_tp(model: str, tp: int) -> None:
    assert validate_layout(LLAMA, Layout(tp=tp, pp=2), model).dims.name == model


def test_405b_has_no_pp4() -> None:
    with pytest.raises(LayoutError) as info:
        validate_layout(LLAMA, Layout(tp=8, pp=4), "Llama-3.1-405B")
    assert "--pp 4: not in Llama-3.1-405B's pp_sizes [1, 2]" in str(info.value)
    assert "does not divide num_layers 126" in str(info.value)


def test_row_parallel_k_comes_from_the_family() -> None:
    dims = load_target("launcher").schema.model_profile_for(LLAMA).checkpoint("Llama-3.2-3B")
    assert family_for("llama3_dense").row_parallel(dims) == (
        ("o", "num_attention_heads", 3072),
        ("down", "intermediate_size", 8192),
    )
