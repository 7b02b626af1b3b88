"""The K-tile combination order of the invariant matmul, as an expression tree.

The one implementation of the order's rules: contract validation (``schema/rules.py``), the
launcher's layout rules (``launcher/layout.py``) and the matmul kernels (``kernels/matmul.py``)
all import it. ``split_problem`` proves that, for a TP size, each rank's K range is a whole
subtree of the TP=1 tree (so a row-parallel split plus the fixed-order tree all-reduce gives the
same bits as TP=1). Trees are nested tuples of tile indices: ``(a, b)`` means ``a + b``.
Standard library only (``schema/`` imports it); the generated ``schema.py`` carries a rendered
copy of ``first_level_block`` for the sibling repos, pinned to this one by a test.
"""

from __future__ import annotations

from functools import lru_cache

Tree = int | tuple


def first_level_block(num_tiles: int) -> int:
    """SGLang's first-level run length: start at T, halve while even and greater than 2."""
    block = num_tiles
    while block % 2 == 0 and block > 2:
        block //= 2
    return block


def pairwise(units: list[Tree]) -> Tree:
    """Adjacent pairwise sums, level by level: ((0+1),(2+3)),… ; an odd last unit is carried."""
    level = list(units)
    while len(level) > 1:
        nxt = [(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def sequential(units: list[Tree]) -> Tree:
    """Left fold: ((u0+u1)+u2)+…"""
    acc = units[0]
    for unit in units[1:]:
        acc = (acc, unit)
    return acc


def tile_tree(first: int, count: int, order: str) -> Tree:
    """The combination tree of tiles ``first .. first+count-1`` computed on one rank
    (``fixed_runs`` has no tile tree: a run is one dot, see ``fixed_runs_problem``)."""
    tiles = list(range(first, first + count))
    if order == "binary":
        return pairwise(tiles)
    if order == "sglang_first_level":
        block = first_level_block(count)
        runs = [sequential(tiles[i : i + block]) for i in range(0, count, block)]
        return pairwise(runs)
    raise ValueError(f"unknown tile order {order!r} (expected 'sglang_first_level' or 'binary')")


def row_parallel_tree(num_tiles: int, tp: int, order: str) -> Tree:
    """Tree of a row-parallel split over ``tp`` ranks: local trees, then the pairwise all-reduce."""
    per_rank = num_tiles // tp
    return pairwise([tile_tree(r * per_rank, per_rank, order) for r in range(tp)])


# The tile-order proof builds the tree of every K/k_block tiles: more tiles than this is refused.
MAX_TILES = 1 << 16


def flatten(tree: Tree) -> list[int]:
    """Pre-order encoding of a tree (-1 for a sum node), built with a stack: a left fold of
    thousands of tiles is that deep, deeper than Python's recursion limit."""
    out: list[int] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, tuple):
            out.append(-1)
            stack.append(node[1])
            stack.append(node[0])
        else:
            out.append(node)
    return out


def fixed_runs_problem(k: int, k_block: int, tp: int, runs: int | None) -> str | None:
    """Why ``fixed_runs`` cannot split K over ``tp`` ranks bit-identically, or None.

    The order is a binary tree over ``runs`` equal runs (each run one float32 dot, never cut).
    A rank holding ``runs / tp`` adjacent runs (a power of two, as ``runs`` and ``tp`` are)
    holds a whole subtree, and the pairwise all-reduce over ranks is the tree's top: so the
    split is exact exactly when every run is whole tiles and ``tp`` divides ``runs``."""
    if runs is None or runs < 1 or runs & (runs - 1):
        return f"matmul_k_runs must be a power of two for 'fixed_runs' (got {runs})"
    if k % (k_block * runs):
        return (
            f"K={k} does not split into {runs} runs of whole {k_block}-wide tiles "
            f"(K/{runs}={k / runs:g}, needs a multiple of {k_block})"
        )
    if runs % tp:
        return f"TP={tp} does not divide the {runs} runs of K={k} (each rank needs whole runs)"
    return None


@lru_cache(maxsize=4096)
def split_problem(k: int, k_block: int, tp: int, order: str, runs: int | None = None) -> str | None:
    """Why a row-parallel K cannot be split over ``tp`` ranks bit-identically, or None if it can.
    ``runs``: ``matmul_k_runs`` (the ``fixed_runs`` order only)."""
    if order == "fixed_runs":
        return fixed_runs_problem(k, k_block, tp, runs)
    if k % (k_block * tp):
        return (
            f"K={k} does not split into whole {k_block}-wide tiles over TP={tp} "
            f"(K/TP={k / tp:g}, needs a multiple of {k_block})"
        )
    tiles = k // k_block
    if tiles > MAX_TILES:
        return (
            f"K={k} is {tiles} tiles of {k_block}: more than {MAX_TILES} tiles "
            "(use a wider matmul_k_block)"
        )
    if flatten(row_parallel_tree(tiles, tp, order)) != flatten(tile_tree(0, tiles, order)):
        return (
            f"K={k} ({tiles} tiles) at TP={tp}: a rank's {tiles // tp} tiles are not a whole "
            f"subtree of the TP=1 '{order}' order"
        )
    return None
