"""Kernel-library tests: the policy of the shipped v1 contract, read from the generated module."""

from __future__ import annotations

import pytest

from contractgen.codegen.vendored import load_target

CONTRACT = "qwen3_dense_true_on_policy_v1"


@pytest.fixture(scope="session")
def kp():
    return load_target("sglang").schema.kernel_policy_for(CONTRACT)
