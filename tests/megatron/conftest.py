"""Fixtures for the Megatron adapter tests: the tiny reference model, its weights, sequences, and
the rollout-side (SGLang reference model) logprobs they must equal bit for bit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from megatron_reference import (
    V1,
    random_sequences,
    rollout_rescore,
    tiny_arch,
    weights_for,
)

# Lengths cross the 64-wide KV chunk and 16-row matmul tiles; one sequence is short.
LENGTHS = (70, 9, 33)


@pytest.fixture(scope="session")
def arch():
    """The contract's reference model with 2 layers (PP=2 puts one layer on each stage)."""
    return tiny_arch(V1, num_layers=2)


@pytest.fixture(scope="session")
def weights(arch):
    return weights_for(arch, seed=0)


@pytest.fixture(scope="session")
def sequences(arch):
    return random_sequences(LENGTHS, arch.vocab_size, seed=1)


@pytest.fixture(scope="session")
def rollout_logprobs(arch, weights, sequences):
    return rollout_rescore(V1, arch, weights, sequences)
