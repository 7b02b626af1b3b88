"""What a TP size must satisfy on a model, for the training and the rollout TP alike: whole
attention and KV heads per rank (the contract's ``parallel.kv_heads`` rule), whole FFN shards,
every row-parallel linear's K split into whole subtrees of the contract's tile order, and the
padded vocab in whole log-softmax chunks per rank (``layout.AXES`` lists them per axis)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..common.layout import padded_vocab
from ..tile_order import first_level_block, split_problem

if TYPE_CHECKING:
    from .layout import Subject


def _kv_divide(kv: int, t: int) -> str | None:
    if kv % t == 0:
        return None
    return (
        f"does not divide num_kv_heads {kv} (parallel.kv_heads 'divide': whole KV heads per rank)"
    )


def _kv_replicate(kv: int, t: int) -> str | None:
    if kv % t == 0 or t % kv == 0:
        return None
    return (
        f"neither divides nor is a multiple of num_kv_heads {kv} "
        "(parallel.kv_heads 'replicate': whole KV heads per rank, or each head copied to TP/KV ranks)"
    )


# parallel.kv_heads -> rule
KV_HEAD_RULES: Mapping[str, Callable[[int, int], str | None]] = {
    "divide": _kv_divide,
    "replicate": _kv_replicate,
}

# kernel_policy.matmul_tile_order -> length of the first-level run of K tiles summed in sequence;
# the runs above it form a binary tree.
TILE_RUN_LENGTH: Mapping[str, Callable[[int], int]] = {
    "sglang_first_level": first_level_block,
    "binary": lambda tiles: 1,
}


def _row_parallel_k(s: Subject, *, experts: bool = True) -> tuple[tuple[str, int], ...]:
    """The K (reduction) size of each row-parallel linear (the family says which): TP splits K.
    ``experts=False`` leaves out the per-expert linears (whole on each rank under EP > 1)."""
    layers = s.family.layer_weights

    def name(role: str) -> str:  # "down_proj", or "expert down_proj" for a per-expert linear
        w = layers[role]
        return ("expert " if w.per_expert else "") + w.hf_name.split(".")[-2]

    return tuple(
        (name(role), k)
        for role, _, k in s.family.row_parallel(s.dims)
        if experts or not layers[role].per_expert
    )


def _tile_split(name: str, k: int, t: int, kernel: Any) -> str | None:
    """TP must give every rank a whole subtree of the contract's K-tile order."""
    block = kernel.matmul_k_block
    runs = getattr(kernel, "matmul_k_runs", None)
    why = None if t == 1 else split_problem(k, block, t, kernel.matmul_tile_order, runs)
    if why is None:
        return None  # the tree proof decides; the rest says why in the launcher's terms
    if kernel.matmul_tile_order == "fixed_runs":
        return f"cannot split {name} exactly: {why}"
    if k % block:
        return f"cannot split {name} (K={k} is not a whole number of {block}-wide tiles) exactly"
    tiles = k // block
    run = TILE_RUN_LENGTH[kernel.matmul_tile_order](tiles)
    # A run of one or two tiles is itself a binary node: the whole order is a binary tree over
    # tiles. Longer runs are summed in sequence and cannot be cut, so ranks split whole runs.
    per_rank = f"{tiles // t}" if tiles % t == 0 else f"{tiles}/{t}"
    return (
        f"splits {name} K={k} ({tiles} tiles of {block} in {tiles // run} first-level runs of "
        f"{run}, {kernel.matmul_tile_order} order) into {per_rank} tiles per rank, not a whole "
        "subtree of the tile order"
    )


def model_tp_rules(*, training: bool) -> tuple[Callable[[Subject, int], str | None], ...]:
    """The model's rules for a TP size; ``training``: the trainer's TP, whose experts are whole
    per rank under EP > 1 (the rollout's experts always split over its TP)."""

    def checkpoint_sizes(s: Subject, t: int) -> str | None:
        sizes = s.dims.tp_sizes
        if sizes is None or t in sizes:
            return None
        return f"not in {s.dims.name}'s tp_sizes {list(sizes)}"

    def heads(s: Subject, t: int) -> str | None:
        h = s.dims.num_attention_heads
        return None if h % t == 0 else f"does not divide num_attention_heads {h}"

    def kv_heads(s: Subject, t: int) -> str | None:
        rule = KV_HEAD_RULES.get(s.support.kv_heads)
        if rule is None:
            known = ", ".join(KV_HEAD_RULES)
            return f"parallel.kv_heads {s.support.kv_heads!r} has no rule here (known: {known})"
        return rule(s.dims.num_kv_heads, t)

    def ffn(s: Subject, t: int) -> str | None:
        i = s.dims.intermediate_size
        return None if i % t == 0 else f"does not divide intermediate_size {i}"

    def tiles(s: Subject, t: int) -> str | None:
        experts = not (training and s.layout.ep > 1)
        problems = [_tile_split(n, k, t, s.kernel) for n, k in _row_parallel_k(s, experts=experts)]
        return "; ".join(p for p in problems if p) or None

    def vocab(s: Subject, t: int) -> str | None:
        chunk = s.kernel.logsoftmax_vocab_block
        padded = padded_vocab(s.dims.vocab_size, t, chunk)
        if padded % t == 0 and (padded // t) % chunk == 0:
            return None
        return f"vocab {s.dims.vocab_size} padded to {padded} is not whole {chunk}-chunks per rank"

    return (checkpoint_sizes, heads, kv_heads, ffn, tiles, vocab)
