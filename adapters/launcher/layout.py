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

from ..common.layout import Layout, LayoutError
from ..families import Family, family_for
from . import generated
from .tp_rules import model_tp_rules

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
        (_allowed("train_tp_sizes", "parallel.training.tp"), *model_tp_rules(training=True)),
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
        (_allowed("rollout_tp_sizes", "parallel.rollout.tp"), *model_tp_rules(training=False)),
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
