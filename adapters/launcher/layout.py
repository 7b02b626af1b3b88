"""Layout validation: training (TP, PP, Ulysses CP, DP, EP) and rollout (TP, DP) against a contract.

Every rule reads the contract through the generated ``schema.py`` (``ParallelSupport``,
``ModelDims``, ``KernelPolicy``). A rule is a small function from a size to a problem (or None),
listed per axis in ``AXES``; the valid alternatives of an axis are the contract's sizes that pass
all of that axis's rules with the other sizes held fixed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..common.layout import Layout, LayoutError, padded_vocab
from ..families import Family, family_for
from ..tile_order import first_level_block, split_problem
from . import generated

REFERENCE_MODEL = "reference"


@dataclass(frozen=True)
class Subject:
    """What a layout is checked against: one contract and one checkpoint of its profile."""

    contract_id: str
    dims: Any  # schema.ModelDims
    support: Any  # schema.ParallelSupport
    kernel: Any  # schema.KernelPolicy
    layout: Layout
    family: Family | None = None  # which linears are row-parallel; None: the contract's family

    def __post_init__(self) -> None:
        if self.family is None:
            name = generated.schema().model_profile_for(self.contract_id).family
            object.__setattr__(self, "family", family_for(name))


@dataclass(frozen=True)
class Violation:
    """One broken rule: the flag, its value, what is wrong, and the valid values of that flag."""

    flag: str
    value: int
    problem: str
    valid: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.flag} {self.value}: {self.problem}; {_alternative(self.flag, self.value, self.valid)}"


def layout_error(contract_id: str, model: str, found: list[Violation]) -> LayoutError:
    """The ``LayoutError`` naming every broken rule of ``contract_id`` on ``model``."""
    lines = [f"invalid layout for {contract_id} on {model}:", *(f"  {v}" for v in found)]
    return LayoutError("\n".join(lines), tuple(found))


class UnknownModelError(KeyError):
    """A ``--model`` name that is not a checkpoint of the contract's profile."""

    def __str__(self) -> str:
        return str(self.args[0])


def _alternative(flag: str, value: int, valid: tuple[int, ...]) -> str:
    if not valid:
        return f"no {flag} size is valid with the other sizes given"
    best = min(abs(v - value) for v in valid)
    nearest = " or ".join(f"{flag} {v}" for v in valid if abs(v - value) == best)
    return f"valid {flag} here: {', '.join(map(str, valid))} (nearest: {nearest})"


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


# --- model-dimension rules (shared by the training and the rollout TP) --------------------------


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


def _model_tp_rules(*, training: bool) -> tuple[Callable[[Subject, int], str | None], ...]:
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


def _allowed(attr: str, path: str) -> Callable[[Subject, int], str | None]:
    def rule(s: Subject, size: int) -> str | None:
        sizes = getattr(s.support, attr)
        return None if size in sizes else f"not in the contract's {path} {list(sizes)}"

    return rule


def _dp_allowed(attr: str, path: str) -> Callable[[Subject, int], str | None]:
    def rule(s: Subject, size: int) -> str | None:
        if size == 1 or getattr(s.support, attr):
            return None
        return f"the contract does not allow data parallelism here ({path}: false)"

    return rule


def _pp_checkpoint(s: Subject, p: int) -> str | None:
    sizes = s.dims.pp_sizes
    return None if sizes is None or p in sizes else f"not in {s.dims.name}'s pp_sizes {list(sizes)}"


def _pp_layers(s: Subject, p: int) -> str | None:
    n = s.dims.num_layers
    return None if n % p == 0 else f"does not divide num_layers {n} (no uneven PP split)"


@dataclass(frozen=True)
class CpKind:
    """How one kind of context parallelism splits the work; ``comm_type`` is Megatron's."""

    comm_type: str
    rules: tuple[Callable[[Subject, int], str | None], ...]


def _ulysses_heads(s: Subject, c: int) -> str | None:
    """Ulysses moves whole heads: the query heads of a TP rank split over the CP ranks; its KV
    heads split too, or (fewer KV heads than CP ranks) are replicated to every CP rank."""
    t, problems = s.layout.tp, []
    heads, kv = s.dims.num_attention_heads, s.dims.num_kv_heads
    if heads % t == 0 and (heads // t) % c:
        problems.append(
            f"does not divide the {heads // t} num_attention_heads per TP rank ({heads}/TP {t}) "
            "that the Ulysses all-to-all spreads over CP ranks"
        )
    if kv % t == 0 and (kv // t) % c and c % (kv // t):
        problems.append(
            f"neither divides nor is a multiple of the {kv // t} num_kv_heads per TP rank "
            f"({kv}/TP {t}): Ulysses splits KV heads over CP ranks or replicates them"
        )
    return "; ".join(problems) or None


def _cp_sequence(s: Subject, c: int) -> str | None:
    n, unit = s.dims.max_position_embeddings, 2 * c
    if c == 1 or n % unit == 0:
        return None
    return f"max_position_embeddings {n} is not a whole number of the 2xCP={unit} sequence chunks"


# parallel.training.cp.kind -> its rules
CP_KINDS: Mapping[str, CpKind] = {
    "ulysses": CpKind(comm_type="a2a", rules=(_ulysses_heads, _cp_sequence)),
}


def _cp_linear_attention(s: Subject, c: int) -> str | None:
    """The reason a hybrid family's contract allows CP 1 only, said where a user asks for more."""
    if c == 1 or "linear_attention" not in s.family.mlp_blocks(s.dims):
        return None
    return (
        f"context parallelism over {s.family.name}'s linear-attention layers is not built "
        "(their recurrent state runs through every token in order and would have to pass "
        "between CP ranks)"
    )


def _cp_kind(s: Subject, c: int) -> str | None:
    if c == 1 or s.support.train_cp_kind in CP_KINDS:
        return None
    known = ", ".join(CP_KINDS)
    return (
        f"parallel.training.cp.kind {s.support.train_cp_kind!r} has no rules here (known: {known})"
    )


def _cp_kind_rules(s: Subject, c: int) -> str | None:
    kind = CP_KINDS.get(s.support.train_cp_kind)
    if kind is None or c == 1:
        return None
    problems = [rule(s, c) for rule in kind.rules]
    return "; ".join(p for p in problems if p) or None


def _ep_experts(s: Subject, e: int) -> str | None:
    n = s.dims.num_experts
    if e == 1:
        return None
    if not n:
        return f"{s.dims.name} has no experts to split"
    return None if n % e == 0 else f"does not divide num_experts {n} (whole experts per rank)"


def _ep_ranks(s: Subject, e: int) -> str | None:
    lay = s.layout
    ranks = lay.tp * lay.cp * lay.dp
    if ranks % e == 0:
        return None
    return (
        f"does not divide TP {lay.tp} x CP {lay.cp} x DP {lay.dp} = {ranks} "
        "(EP folds over the trainer ranks of one pipeline stage)"
    )


@dataclass(frozen=True)
class Axis:
    """One flag: where its value is read from, its rules, and the sizes tried as alternatives."""

    flag: str
    get: Callable[[Layout], int]
    rules: tuple[Callable[[Subject, int], str | None], ...]
    candidates: Callable[[Subject], tuple[int, ...]]


AXES: tuple[Axis, ...] = (
    Axis(
        "--tp",
        lambda lay: lay.tp,
        (_allowed("train_tp_sizes", "parallel.training.tp"), *_model_tp_rules(training=True)),
        lambda s: s.support.train_tp_sizes,
    ),
    Axis(
        "--pp",
        lambda lay: lay.pp,
        (_allowed("train_pp_sizes", "parallel.training.pp"), _pp_checkpoint, _pp_layers),
        lambda s: s.support.train_pp_sizes,
    ),
    Axis(
        "--cp",
        lambda lay: lay.cp,
        (
            _allowed("train_cp_sizes", "parallel.training.cp.sizes"),
            _cp_linear_attention,
            _cp_kind,
            _cp_kind_rules,
        ),
        lambda s: s.support.train_cp_sizes,
    ),
    Axis(
        "--dp",
        lambda lay: lay.dp,
        (_dp_allowed("train_dp", "parallel.training.dp"),),
        lambda s: (1,) if not s.support.train_dp else (),
    ),
    Axis(
        "--ep",
        lambda lay: lay.ep,
        (_allowed("train_ep_sizes", "parallel.training.ep"), _ep_experts, _ep_ranks),
        lambda s: s.support.train_ep_sizes,
    ),
    Axis(
        "--rollout-tp",
        lambda lay: lay.rollout_tp_size,
        (_allowed("rollout_tp_sizes", "parallel.rollout.tp"), *_model_tp_rules(training=False)),
        lambda s: s.support.rollout_tp_sizes,
    ),
    Axis(
        "--rollout-dp",
        lambda lay: lay.rollout_dp,
        (_dp_allowed("rollout_dp", "parallel.rollout.dp"),),
        lambda s: (1,) if not s.support.rollout_dp else (),
    ),
)

# Which Layout attribute each flag sets, to try alternatives with the other sizes held fixed.
_FLAG_FIELD = {
    "--tp": "tp",
    "--pp": "pp",
    "--cp": "cp",
    "--dp": "dp",
    "--ep": "ep",
    "--rollout-tp": "rollout_tp",
    "--rollout-dp": "rollout_dp",
}


def _valid_sizes(axis: Axis, s: Subject) -> tuple[int, ...]:
    valid = []
    for size in axis.candidates(s):
        layout = replace(s.layout, **{_FLAG_FIELD[axis.flag]: size})
        trial = replace(s, layout=layout)
        if all(rule(trial, size) is None for rule in axis.rules):
            valid.append(size)
    return tuple(valid)


def select_checkpoint(contract_id: str, model: str | None) -> Any:
    """The checkpoint ``--model`` names: default the profile's first; ``reference`` its
    reference model."""
    profile = generated.schema().model_profile_for(contract_id)
    by_name = {d.name: d for d in profile.checkpoints}
    by_name[profile.reference_model.name] = profile.reference_model
    by_name[REFERENCE_MODEL] = profile.reference_model
    if model is None:
        return profile.checkpoints[0]
    if model not in by_name:
        known = ", ".join([*(d.name for d in profile.checkpoints), REFERENCE_MODEL])
        raise UnknownModelError(
            f"--model {model!r}: not a checkpoint of the {profile.family} profile of "
            f"{contract_id}; known: {known}"
        )
    return by_name[model]


def subject_for(contract_id: str, layout: Layout, model: str | None = None) -> Subject:
    """Resolve the contract's data for a layout (unknown ids raise UnknownContractError)."""
    schema = generated.schema()
    return Subject(
        contract_id=contract_id,
        dims=select_checkpoint(contract_id, model),
        support=schema.parallel_support_for(contract_id),
        kernel=schema.kernel_policy_for(contract_id),
        layout=layout,
    )


def violations(subject: Subject) -> list[Violation]:
    """Every rule the layout breaks, in axis order (an empty list: the layout is valid)."""
    found: list[Violation] = []
    layout = subject.layout
    for axis in AXES:
        value = axis.get(layout)
        problems = [p for rule in axis.rules if (p := rule(subject, value)) is not None]
        if problems:
            valid = _valid_sizes(axis, subject)
            found += [Violation(axis.flag, value, p, valid) for p in problems]
    if layout.world is not None and layout.world != layout.train_world:
        rest = layout.tp * layout.pp * layout.cp
        valid = (layout.world // rest,) if layout.world % rest == 0 else ()
        found.append(
            Violation(
                "--dp",
                layout.dp,
                f"world {layout.world} != TP {layout.tp} x PP {layout.pp} x CP {layout.cp} x "
                f"DP {layout.dp} = {layout.train_world}",
                valid,
            )
        )
    return found


def validate_layout(contract_id: str, layout: Layout, model: str | None = None) -> Subject:
    """The checked subject, or LayoutError naming every broken rule and a valid alternative."""
    subject = subject_for(contract_id, layout, model)
    found = violations(subject)
    if found:
        raise layout_error(contract_id, subject.dims.name, found)
    return subject
