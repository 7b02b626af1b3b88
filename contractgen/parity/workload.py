"""The gate's workload, from the role level (``adapters/common/workload.py``): the CLI and the
gate's modules read it here (torch-free)."""

from ..adapters.common.workload import (
    DEFAULT_PROMPT_TOKENS,
    DEFAULT_WORKLOAD,
    WORKLOADS,
    PromptSpec,
    describe,
    fitted,
    make_workload,
    sample_seed,
    scored_tokens,
)

__all__ = [
    "DEFAULT_PROMPT_TOKENS",
    "DEFAULT_WORKLOAD",
    "WORKLOADS",
    "PromptSpec",
    "describe",
    "fitted",
    "make_workload",
    "sample_seed",
    "scored_tokens",
]
