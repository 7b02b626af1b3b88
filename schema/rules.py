"""Rules that relate one part of a contract to another.

Each rule returns ``(field path, message)`` pairs; the loader turns paths into ``file:line:col``.
These are the checks JSON Schema cannot express (divisibility, tile-tree alignment, consistency of
runtime policy with kernel policy), so a file can satisfy ``contract.schema.json`` and still fail
here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .models import Contract
from .rules_base import Finding
from .rules_blocks import check_family, check_hybrid, check_moe, check_tied_router_experts
from .rules_policy import check_lora, check_policy_consistency, check_unobservable_paths
from .rules_sizes import (
    check_dims,
    check_fixed_runs,
    check_layers_vs_pp,
    check_tree_needs_power_of_two,
    check_unique_sizes,
    check_vocab_block,
    column_runs,
)

__all__ = [
    "RULES",
    "Finding",
    "check_contract",
    "check_dims",
    "check_family",
    "check_fixed_runs",
    "check_hybrid",
    "check_layers_vs_pp",
    "check_lora",
    "check_moe",
    "check_policy_consistency",
    "check_tied_router_experts",
    "check_tree_needs_power_of_two",
    "check_unique_sizes",
    "check_unobservable_paths",
    "check_vocab_block",
    "column_runs",
]


RULES: tuple[Callable[[Contract], Iterator[Finding]], ...] = (
    check_family,
    check_moe,
    check_hybrid,
    check_tied_router_experts,
    check_unique_sizes,
    check_tree_needs_power_of_two,
    check_dims,
    check_fixed_runs,
    check_vocab_block,
    check_layers_vs_pp,
    check_policy_consistency,
    check_lora,
    check_unobservable_paths,
)


def check_contract(c: Contract) -> list[Finding]:
    """Every cross-field finding for one contract, in rule order."""
    out: list[Finding] = []
    for rule in RULES:
        out.extend(rule(c))
    return out
