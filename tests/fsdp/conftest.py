"""Fixtures of the FSDP trainer's tests."""

from __future__ import annotations

import pytest

V1 = "qwen3_dense_true_on_policy_v1"


@pytest.fixture(scope="session")
def reference_weights():
    """The v1 reference model's seeded random weights (what `parity` builds by default)."""
    from contractgen.adapters.common.model import ModelArch, random_weights
    from contractgen.codegen.vendored import load_target

    arch = ModelArch.from_profile(load_target("fsdp").schema.model_profile_for(V1))
    return arch, random_weights(arch, seed=0)
