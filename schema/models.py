"""Pydantic models of a contract file: the single source of truth.

Validate at the edge, trust inside: every model forbids unknown keys and is frozen. Structural rules
live here (types, ranges, patterns); rules that relate one part of a contract to another live in
``rules.py`` so that each failure can name the exact field it is about.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from .base import MAX_SIZE, SCHEMA_VERSION, ContractId, Dtype, Identifier, PositiveInt, _Model
from .kernel_policy import (
    HYBRID_KERNEL_FIELDS,
    LORA_KERNEL_FIELDS,
    MOE_KERNEL_FIELDS,
    OPTIONAL_KERNEL_FIELDS,
    KernelPolicy,
)
from .profile import (
    HYBRID_DIMS_FIELDS,
    MOE_DIMS_FIELDS,
    REFERENCE_ONLY_DIMS_FIELDS,
    Architectures,
    CheckpointRope,
    ContextParallel,
    Identity,
    ModelDims,
    ModelProfile,
    NormSpec,
    ParallelSupport,
    RolloutLayouts,
    RopeScaling,
    RopeSpec,
    TrainingLayouts,
)
from .runtime_policy import (
    TARGET_POLICY_MODELS,
    Flag,
    FromConfig,
    FsdpRuntimePolicy,
    LauncherRuntimePolicy,
    LayoutCondition,
    MegatronRuntimePolicy,
    RuntimePolicies,
    SGLangRuntimePolicy,
    When,
)

__all__ = [
    "HYBRID_DIMS_FIELDS",
    "HYBRID_KERNEL_FIELDS",
    "LORA_KERNEL_FIELDS",
    "MAX_SIZE",
    "MOE_DIMS_FIELDS",
    "MOE_KERNEL_FIELDS",
    "OPTIONAL_KERNEL_FIELDS",
    "REFERENCE_ONLY_DIMS_FIELDS",
    "SCHEMA_VERSION",
    "TARGET_POLICY_MODELS",
    "Architectures",
    "CheckpointRope",
    "ContextParallel",
    "Contract",
    "ContractId",
    "Dtype",
    "Flag",
    "FromConfig",
    "FsdpRuntimePolicy",
    "Identifier",
    "Identity",
    "KernelPolicy",
    "LauncherRuntimePolicy",
    "LayoutCondition",
    "LoraSupport",
    "LoraTarget",
    "MegatronRuntimePolicy",
    "ModelDims",
    "ModelProfile",
    "NormSpec",
    "ParallelSupport",
    "PositiveInt",
    "RolloutLayouts",
    "RopeScaling",
    "RopeSpec",
    "RuntimePolicies",
    "SGLangRuntimePolicy",
    "TrainingLayouts",
    "When",
]


# ---------------------------------------------------------------------------------------------
# LoRA: which adapters a contract admits (their numerics are the kernel policy's lora_* fields).

LoraTarget = Literal["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraSupport(_Model):
    """The adapters a LoRA contract admits. Dense linears only: MoE experts' LoRA is not part of
    any contract yet (a LoRA section on an MoE family is refused)."""

    target_modules: tuple[LoraTarget, ...] = Field(
        min_length=1,
        description=(
            "Linears that carry an adapter, by their Hugging Face / PEFT module name; each must "
            "be a column- or row-parallel linear of the family. Column-parallel (q/k/v, "
            "gate/up): A replicated on every TP rank, B split by output rows. Row-parallel "
            "(o, down): A split by input columns (x·Aᵀ's partial sums finished by the "
            "contract's all-reduce), B replicated."
        ),
    )
    max_rank: PositiveInt = Field(
        description="Largest adapter rank r (1 <= r <= max_rank); the trainer's --lora-rank bound."
    )
    max_alpha: Annotated[float, Field(gt=0, le=MAX_SIZE)] = Field(
        description="Largest lora_alpha (0 < alpha <= max_alpha); the scale is alpha / r."
    )
    dropout: Annotated[float, Field(ge=0, le=0)] = Field(
        description=(
            "LoRA dropout: 0 (a dropout mask is a second random draw the rollout cannot make)."
        )
    )


# ---------------------------------------------------------------------------------------------
# The contract.


class Contract(_Model):
    """One true-on-policy contract: an id that names exact numerics."""

    schema_version: Literal[1] = Field(description="Version of the contract file format.")
    id: ContractId = Field(description="Contract id, e.g. qwen3_dense_true_on_policy_v1.")
    family: Identifier = Field(description="Model family, e.g. qwen3_dense.")
    description: Annotated[str, Field(min_length=1)] = Field(description="What and why.")
    supersedes: ContractId | None = Field(
        default=None, description="Id of the contract this one replaces."
    )
    identity: Identity
    model_profile: ModelProfile
    parallel: ParallelSupport
    kernel_policy: KernelPolicy
    runtime_policy: RuntimePolicies
    lora: LoraSupport | None = Field(
        default=None,
        description=(
            "LoRA adapters under this contract (numerics: kernel_policy.lora_*); absent: the "
            "contract serves and trains base weights only."
        ),
    )
    unobservable: dict[
        Annotated[str, Field(pattern=r"^(kernel_policy|runtime_policy\.[a-z]+)\.[a-z0-9_]+$")],
        Annotated[str, Field(min_length=1)],
    ] = Field(
        default_factory=dict,
        description=(
            "Policy fields whose flip the parity gate cannot make visible in the forward "
            "logprobs under this contract's numerics, keyed by field path, each with why the "
            "field exists and where it is tested instead. The gate reports these faults as "
            "explained instead of undetected, and fails if one of them is detected after all."
        ),
    )

    @model_serializer(mode="wrap")
    def _omit_absent_lora(self, handler: SerializerFunctionWrapHandler) -> dict:
        # A contract without adapters serialises as before the lora section existed.
        data = handler(self)
        if data.get("lora", ...) is None:
            del data["lora"]
        return data
