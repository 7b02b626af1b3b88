"""Shared fixtures for the SGLang adapter tests.

The ONE place policies are created: ``kp``, ``profile`` and ``runtime_policy`` (the public v1,
read from the generated modules).
Float32 and other variants are derived from it with ``dataclasses.replace``.
"""

from __future__ import annotations

import dataclasses

import pytest

CONTRACT = "qwen3_dense_true_on_policy_v1"


def _generated():
    from contractgen.codegen.vendored import load_target

    return load_target("sglang")


@pytest.fixture(scope="session")
def generated():
    """The generated sglang target (``.schema``, ``.runtime_policy``)."""
    return _generated()


def fp32_variant(kp):
    """Every dtype field of ``kp`` set to float32 (for float32 invariance and HF agreement)."""
    return dataclasses.replace(
        kp,
        **{f.name: "float32" for f in dataclasses.fields(kp) if f.name.endswith("_dtype")},
    )


@pytest.fixture(scope="session")
def kp():
    return _generated().schema.kernel_policy_for(CONTRACT)


@pytest.fixture(scope="session")
def profile():
    return _generated().schema.model_profile_for(CONTRACT)


@pytest.fixture(scope="session")
def runtime_policy():
    """Runtime policy factory: ``runtime_policy(tp_size)`` as SGLang would resolve it."""
    from types import SimpleNamespace

    return lambda tp_size=1: _generated().runtime_policy.policy_for(
        CONTRACT, SimpleNamespace(tp_size=tp_size)
    )


@pytest.fixture(scope="session")
def kp32(kp):
    return fp32_variant(kp)


@pytest.fixture(scope="session", params=["bfloat16", "float32"])
def kp_dtype(request, kp):
    """(policy, torch dtype) for both dtypes the invariance tests run in."""
    import torch

    pol = kp if request.param == "bfloat16" else fp32_variant(kp)
    return pol, getattr(torch, request.param)
