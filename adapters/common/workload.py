"""The gate's workload: concurrent requests of different lengths (torch-free: the CLI reads it).

A role-level description: every rollout target generates it, every trainer scores its sequences
(``PromptSpec``). ``contractgen.parity.workload`` re-exports it for the gate and the CLI.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class PromptSpec:
    """One request of the gate's workload (token ids are drawn from the model's vocab)."""

    rid: str
    prompt_len: int
    max_new_tokens: int
    temperature: float
    seed: int
    arrival_step: int
    prompt_ids: tuple[int, ...] | None = None
    """The prompt's token ids (``prompt_len`` of them); default: drawn by the rollout."""
    top_k: int = -1
    """Top-k truncation of the sampled distribution (<= 0: off); scored truncated too."""
    top_p: float = 1.0
    """Top-p truncation (1: off); scored truncated too."""


def sample_seed(base_seed: int, step: int, prompt: int, sample: int) -> int:
    """The seed of one sample: a 63-bit digest of (base seed, RL step, prompt, sample index), so
    the samples of a prompt draw independently while a re-run draws the same ones."""
    key = f"contractgen-sample|{base_seed}|{step}|{prompt}|{sample}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1


# Greedy and seeded sampling alternate; requests join at staggered decode steps. The sampled
# requests cover temperature != 1, top-k and top-p (every side scores the processed distribution).
TEMPERATURES = (0.0, 0.8, 0.0, 1.0)
TOP_K = (-1, 40, -1, -1)
TOP_P = (1.0, 1.0, 1.0, 0.9)


# The default longest prompt: prompts of 44, 88, 132 and 176 tokens with 10 new tokens each, so
# two requests are scored from queries past two 64-position KV chunks (132..141 and 176..185: three
# chunks merged by the online softmax, decode steps crossing into the third) and one from the
# second chunk. Reaching that far is what shows a trainer that attends packs reaching position 128
# in 128-key chunks (measured by re-scoring these sequences with 128-key chunks: 7 of the 40
# scored bf16 logprobs differ, 6 of them greedy; with a 124-token longest prompt none did, and 70
# cannot reach 128).
DEFAULT_PROMPT_TOKENS = 176


def make_workload(
    requests: int = 4, prompt_tokens: int = DEFAULT_PROMPT_TOKENS, new_tokens: int = 10
) -> tuple[PromptSpec, ...]:
    """``requests`` concurrent requests of different lengths (the longest prompt has
    ``prompt_tokens``, the others an even spread below it), ``new_tokens`` each, greedy and seeded
    sampling, joining at different steps. The defaults give 40 scored tokens; prompts of 44, 88,
    132 and 176 tokens (``DEFAULT_PROMPT_TOKENS``)."""
    if min(requests, prompt_tokens, new_tokens) < 1:
        raise ValueError("--requests, --prompt-tokens and --new-tokens must each be >= 1")
    return tuple(
        PromptSpec(
            rid=f"r{i}",
            prompt_len=max(1, prompt_tokens * ((i + requests - 1) % requests + 1) // requests),
            max_new_tokens=new_tokens,
            temperature=TEMPERATURES[i % len(TEMPERATURES)],
            seed=sample_seed(0, 0, i, 0),
            arrival_step=i % 3,
            top_k=TOP_K[i % len(TOP_K)],
            top_p=TOP_P[i % len(TOP_P)],
        )
        for i in range(requests)
    )


DEFAULT_WORKLOAD = make_workload()

# Named workload presets of ``contractgen parity --workload``: (requests, prompt tokens, new tokens).
# "large": 256 scored tokens (6.4x the default) from many requests rather than many decode steps
# or long prompts, which cost the most on CPU; the longest sequence crosses two KV-chunk boundaries
# too. It is the workload a fault gets a second chance on when the run's own workload is too
# small to show it (``harness.run_faults``). Agreement with transformers has its own, longer
# sequences (``reference.REFERENCE_LENGTHS``).
WORKLOADS: dict[str, tuple[int, int, int]] = {
    "default": (4, DEFAULT_PROMPT_TOKENS, 10),
    "large": (16, 128, 16),
}


def describe(name: str) -> str:
    """``8 requests x 256-token prompts x 32 new tokens`` for a preset."""
    requests, prompt, new = WORKLOADS[name]
    return f"{requests} requests x {prompt}-token longest prompt x {new} new tokens"


def scored_tokens(workload: tuple[PromptSpec, ...]) -> int:
    """Response tokens the gate compares on ``workload``."""
    return sum(p.max_new_tokens for p in workload)


def fitted(name: str, max_positions: int) -> tuple[PromptSpec, ...]:
    """The preset ``name``, its prompts shortened so that prompt + new tokens fit a model of
    ``max_positions`` positions."""
    requests, prompt, new = WORKLOADS[name]
    return make_workload(requests, max(1, min(prompt, max_positions - new)), new)
