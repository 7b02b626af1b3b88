"""Shared fixtures for the SGLang adapter tests.

The ONE place a kernel policy is created: ``kp`` (the public v1, read from the generated schema).
Float32 and other variants are derived from it with ``dataclasses.replace``.
"""

from __future__ import annotations

import dataclasses

import pytest

CONTRACT = "qwen3_dense_true_on_policy_v1"


def _v1_kernel_policy():
    try:
        from contractgen.vendored import load_target

        return load_target("sglang").schema.kernel_policy_for(CONTRACT)
    except Exception:  # generator not landed yet: the v1 values from docs/generated-api.md

        @dataclasses.dataclass(frozen=True)
        class KernelPolicy:
            dense_math_dtype: str = "bfloat16"
            matmul_k_block: int = 128
            matmul_accumulation_dtype: str = "bfloat16"
            matmul_tile_order: str = "sglang_first_level"
            all_reduce: str = "fixed_tree"
            norm_compute_dtype: str = "float32"
            norm_cast_before_weight: bool = True
            rope_dtype: str = "float32"
            attention_kv_chunk: int = 64
            attention_softmax_dtype: str = "float32"
            residual_dtype: str = "bfloat16"
            lm_head_input_dtype: str = "bfloat16"
            logsoftmax_dtype: str = "bfloat16"
            logsoftmax_vocab_block: int = 128

        return KernelPolicy()


def fp32_variant(kp):
    """Every dtype field of ``kp`` set to float32 (for float32 invariance and HF agreement)."""
    return dataclasses.replace(
        kp,
        **{f.name: "float32" for f in dataclasses.fields(kp) if f.name.endswith("_dtype")},
    )


@pytest.fixture(scope="session")
def kp():
    return _v1_kernel_policy()


@pytest.fixture(scope="session")
def kp32(kp):
    return fp32_variant(kp)


@pytest.fixture(scope="session", params=["bfloat16", "float32"])
def kp_dtype(request, kp):
    """(policy, torch dtype) for both dtypes the invariance tests run in."""
    import torch

    pol = kp if request.param == "bfloat16" else fp32_variant(kp)
    return pol, getattr(torch, request.param)
