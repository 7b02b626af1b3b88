"""``KernelPolicy`` is defined once: the adapters' class is the generated one (the vendored
``schema.py`` every target ships), not a hand copy held equal by a test. Its fields are the
contract schema's, in order; ``kernel_policy`` converts any target's copy (and the pydantic model)
keeping every value, and names a missing attribute."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from contractgen.adapters.kernels import KernelPolicy, kernel_policy
from contractgen.adapters.kernels import policy as policy_module
from contractgen.codegen.vendored import load_target
from contractgen.schema import models


def test_the_adapters_policy_is_the_generated_class():
    assert KernelPolicy.__module__.startswith("contractgen._vendored.")
    assert KernelPolicy.__module__.endswith(".schema")
    source = inspect.getsource(policy_module)
    assert "@dataclass" not in source and "class KernelPolicy" not in source


def test_its_fields_are_the_schemas_in_order():
    assert [f.name for f in dataclasses.fields(KernelPolicy)] == list(
        models.KernelPolicy.model_fields
    )


@pytest.mark.parametrize("target", ["sglang", "megatron", "fsdp"])
def test_kernel_policy_keeps_every_value_of_every_shipped_contract(target):
    schema = load_target(target).schema
    for contract in schema.CONTRACT_IDS:
        generated = schema.kernel_policy_for(contract)
        typed = kernel_policy(generated)
        assert isinstance(typed, KernelPolicy)
        assert dataclasses.asdict(typed) == dataclasses.asdict(generated)
        assert kernel_policy(typed) is typed


def test_kernel_policy_names_a_missing_attribute():
    class Old:
        dense_math_dtype = "bfloat16"

    with pytest.raises(AttributeError, match="matmul_k_block"):
        kernel_policy(Old())
