"""Rules of sizes and layouts: unique sizes, power-of-two TP under the tree, dimensions splitting
into whole tile runs, fixed and column runs, the vocab block, layers over PP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..adapters.tile_order import split_problem
from .models import (
    MOE_DIMS_FIELDS,
    Contract,
)
from .rules_base import Finding, _dims_entries, _family, _is_power_of_two, _nearest, _tp_sizes_for


def check_unique_sizes(c: Contract) -> Iterator[Finding]:
    lists = {
        "parallel.training.tp": c.parallel.training.tp,
        "parallel.training.pp": c.parallel.training.pp,
        "parallel.training.cp.sizes": c.parallel.training.cp.sizes,
        "parallel.rollout.tp": c.parallel.rollout.tp,
    }
    for path, sizes in lists.items():
        if len(set(sizes)) != len(sizes) or list(sizes) != sorted(sizes):
            yield path, f"must be sorted and free of repeats (got {list(sizes)})"
        if 1 not in sizes:
            yield path, f"must include 1 (got {list(sizes)})"


def check_tree_needs_power_of_two(c: Contract) -> Iterator[Finding]:
    if c.kernel_policy.all_reduce != "fixed_tree":
        return
    for path, sizes in (
        ("parallel.training.tp", c.parallel.training.tp),
        ("parallel.rollout.tp", c.parallel.rollout.tp),
    ):
        for i, tp in enumerate(sizes):
            if not _is_power_of_two(tp):
                yield (
                    f"{path}.{i}",
                    f"TP={tp} is not a power of two; the fixed-tree all-reduce needs one "
                    f"(nearest allowed: {_nearest([1, 2, 4, 8, 16, 32, 64], tp)})",
                )


def check_dims(c: Contract) -> Iterator[Finding]:
    """Each checkpoint's dims split evenly, and into whole tile subtrees, at every allowed TP."""
    kp = c.kernel_policy
    tree = kp.all_reduce == "fixed_tree"
    family = _family(c)
    # run counts that are not powers of two are check_fixed_runs' finding, once, not per K
    runs_ok = all(
        r is None or _is_power_of_two(r) for r in (kp.matmul_k_runs, kp.matmul_column_k_runs)
    )
    for path, d in _dims_entries(c):
        if d.head_dim % 2:  # RoPE rotates pairs of dimensions: no kernel here runs an odd one
            yield (
                f"{path}.head_dim",
                f"must be even: RoPE rotates pairs of dimensions (got {d.head_dim})",
            )
        if d.num_attention_heads % d.num_kv_heads:
            yield (
                f"{path}.num_kv_heads",
                f"must divide num_attention_heads (got {d.num_kv_heads} for {d.num_attention_heads})",
            )
            continue
        if d.tp_sizes is not None:
            extra = sorted(
                set(d.tp_sizes) - set(c.parallel.training.tp) - set(c.parallel.rollout.tp)
            )
            if extra:
                yield (
                    f"{path}.tp_sizes",
                    f"lists TP sizes the contract does not allow: {extra} "
                    f"(allowed: {sorted(set(c.parallel.training.tp) | set(c.parallel.rollout.tp))})",
                )
        moe_ok = (
            family is None
            or family.moe is None
            or all(getattr(d, f) is not None for f in MOE_DIMS_FIELDS)
        )
        if kp.matmul_tile_order == "fixed_runs" and family is not None and moe_ok and runs_ok:
            # every matmul, column-parallel and LM head too, runs K in whole runs at TP=1 already
            # (a row-parallel K in matmul_k_runs, any other in matmul_column_k_runs if set)
            unfit = {}
            rows = {role for role, _, _ in family.row_parallel(d)}
            for role, field, k in family.matmul_ks(d):
                runs = kp.matmul_k_runs if role in rows else column_runs(kp)
                why = split_problem(k, kp.matmul_k_block, 1, "fixed_runs", runs)
                if why:
                    unfit.setdefault(field, f"{role}: {why}")
            for field, why in unfit.items():
                yield (
                    f"{path}.{field}",
                    f"{why}, at every TP; under fixed_runs no tp_sizes helps: gate this "
                    "checkpoint under a contract with a per-tile matmul order",
                )
            if unfit:
                continue
        found: dict[str, str] = {}  # one finding per field: the smallest TP that fails
        for tp in _tp_sizes_for(c, d):
            if tp == 1 or (tree and not _is_power_of_two(tp)):
                continue  # TP=1 splits every K but fixed_runs' (above); non-powers of two: own rule
            checks = [
                ("num_attention_heads", d.num_attention_heads % tp != 0,
                 f"TP={tp} must divide num_attention_heads (got {d.num_attention_heads})"),
                ("num_kv_heads",
                 d.num_kv_heads % tp != 0 and (c.parallel.kv_heads == "divide" or tp % d.num_kv_heads != 0),
                 f"TP={tp} must divide num_kv_heads (got {d.num_kv_heads}); or set "
                 "parallel.kv_heads: replicate when TP is a multiple of it"),
                ("intermediate_size", d.intermediate_size % tp != 0,
                 f"TP={tp} must divide intermediate_size (got {d.intermediate_size})"),
            ]  # fmt: skip
            for field, bad, message in checks:
                if bad:
                    found.setdefault(field, message)
            row_parallel = family.row_parallel(d) if family is not None and moe_ok else ()
            for _, field, k in row_parallel:
                why = split_problem(
                    k, kp.matmul_k_block, tp, kp.matmul_tile_order, kp.matmul_k_runs
                )
                if why:
                    found.setdefault(field, why)
        hint = "list the TP sizes this checkpoint supports in tp_sizes"
        for field, message in found.items():
            yield f"{path}.{field}", f"{message}; {hint}"


def column_runs(kp: Any) -> int | None:
    """The run count of a matmul whose K no TP layout splits: ``matmul_column_k_runs`` if set,
    else ``matmul_k_runs`` (as the kernels' ``matmul.k_runs``)."""
    return kp.matmul_column_k_runs or kp.matmul_k_runs


def check_fixed_runs(c: Contract) -> Iterator[Finding]:
    """``matmul_k_runs`` is set exactly under ``fixed_runs``, which accumulates in float32 and
    needs every allowed TP size to divide the run count (per-checkpoint K is ``check_dims``');
    ``matmul_column_k_runs`` only with it, a power of two, and (for now) only where every
    matmul is a dense layer's or the LM head's."""
    kp = c.kernel_policy
    path = "kernel_policy.matmul_k_runs"
    if kp.matmul_tile_order != "fixed_runs":
        for field in ("matmul_k_runs", "matmul_column_k_runs"):
            if getattr(kp, field) is not None:
                yield (
                    f"kernel_policy.{field}",
                    (
                        "is only read by matmul_tile_order 'fixed_runs' "
                        f"(got '{kp.matmul_tile_order}'); remove it"
                    ),
                )
        return
    yield from _column_runs_problems(c)
    runs = kp.matmul_k_runs
    if runs is None:
        yield path, "is required when matmul_tile_order is 'fixed_runs' (a power of two, e.g. 8)"
        return
    if not _is_power_of_two(runs):
        yield (
            path,
            (
                f"must be a power of two (got {runs}; nearest: "
                f"{_nearest([1, 2, 4, 8, 16, 32, 64], runs)})"
            ),
        )
        return
    if kp.matmul_accumulation_dtype != "float32":
        yield (
            "kernel_policy.matmul_accumulation_dtype",
            (
                "must be float32 under matmul_tile_order 'fixed_runs' (a run is one float32 dot; "
                f"got {kp.matmul_accumulation_dtype})"
            ),
        )
    for where, sizes in (
        ("parallel.training.tp", c.parallel.training.tp),
        ("parallel.rollout.tp", c.parallel.rollout.tp),
    ):
        bad = [tp for tp in sizes if runs % tp]
        if bad:
            yield (
                where,
                (
                    f"TP={bad[0]} does not divide kernel_policy.matmul_k_runs={runs} (a row-parallel "
                    f"rank holds matmul_k_runs / TP whole runs); allowed: "
                    f"{[t for t in sizes if runs % t == 0]}"
                ),
            )


def _column_runs_problems(c: Contract) -> Iterator[Finding]:
    kp = c.kernel_policy
    runs = kp.matmul_column_k_runs
    if runs is None:
        return
    path = "kernel_policy.matmul_column_k_runs"
    if not _is_power_of_two(runs):
        yield (
            path,
            f"must be a power of two (got {runs}; nearest: {_nearest([1, 2, 4, 8, 16, 32, 64], runs)})",
        )
    family = _family(c)
    if family is not None and (family.moe is not None or family.hybrid is not None):
        yield (
            path,
            (
                f"is not supported for family '{c.family}' yet: its expert and linear-attention "
                "matmuls are not classified as row- or column-parallel for every layout "
                "(remove it; matmul_k_runs then applies to every matmul)"
            ),
        )


def check_vocab_block(c: Contract) -> Iterator[Finding]:
    """A vocab that is not whole blocks per rank is padded; only a trimming trainer may allow it."""
    if c.runtime_policy.megatron.apply_logits_contract:
        return
    block = c.kernel_policy.logsoftmax_vocab_block
    for path, d in _dims_entries(c):
        bad = [tp for tp in _tp_sizes_for(c, d) if d.vocab_size % (block * tp)]
        if bad:
            yield (
                f"{path}.vocab_size",
                f"vocab {d.vocab_size} is not a whole number of {block}-wide blocks per rank at "
                f"TP={bad[0]}; set runtime_policy.megatron.apply_logits_contract: true so the "
                "padded vocabulary is trimmed before log-softmax",
            )


def check_layers_vs_pp(c: Contract) -> Iterator[Finding]:
    allowed = c.parallel.training.pp
    for path, d in _dims_entries(c):
        if d.pp_sizes is not None:
            extra = sorted(set(d.pp_sizes) - set(allowed))
            if extra:
                yield (
                    f"{path}.pp_sizes",
                    f"lists PP sizes the contract does not allow: {extra} (allowed: {list(allowed)})",
                )
        for pp in allowed if d.pp_sizes is None else sorted(set(allowed) & set(d.pp_sizes)):
            if d.num_layers % pp:
                yield (
                    f"{path}.num_layers",
                    f"PP={pp} must divide num_layers (got {d.num_layers}); "
                    f"allowed PP sizes that divide it: "
                    f"{[p for p in range(1, d.num_layers + 1) if d.num_layers % p == 0][:6]}; "
                    "or list the PP sizes this checkpoint supports in pp_sizes",
                )
