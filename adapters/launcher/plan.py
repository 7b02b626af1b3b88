"""The launch plan: a validated layout rendered through the tables into args, env and commands.

``build_plan`` is a pure function of (contract, layout, model, environment): it reads the generated
modules, resolves each target's runtime policy for the layout, and renders every table row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ..common.layout import padded_vocab
from . import generated
from .layout import CP_KINDS, Layout, Subject, validate_layout
from .miles_form import YOU_ADD, once, sglang_args_for_miles
from .rows import VALUE, Choice, EngineSide, Env, Flag, Forbid, Option, Row
from .tables import (
    REAL_SGLANG_UNPROVEN,
    ROLLOUT_COMMAND,
    SGLANG_RELEASE,
    TABLES,
    TRAINER_COMMAND,
    UNRELEASED_SGLANG_FLAGS,
)

# What the trainer runs under every contract, whatever megatron-core defaults to.
TRAINER_DETERMINISM = {"attention_dropout": 0.0, "hidden_dropout": 0.0}


class PlanError(ValueError):
    """The contract cannot be rendered (a disabled launcher, a value no row knows)."""


@dataclass(frozen=True)
class Rendered:
    """One table row after rendering: what it emitted (possibly nothing) and why."""

    table: str
    source: str
    value: Any
    kind: str  # "arg" | "env" | "engine" | "forbid"
    reason: str
    args: tuple[str, ...] = ()  # for "env": (NAME, value); for "forbid": (flag,)
    config: tuple[tuple[str, Any], ...] = ()  # TransformerConfig fields the args set
    fork_only: bool = False
    note: str | None = None

    @property
    def emitted(self) -> bool:
        return bool(self.args)


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a true-on-policy launch needs, with the source and reason of each item."""

    contract_id: str
    fingerprint: str
    logprob_contract: str
    newer_contract: str | None
    model: Any  # schema.ModelDims
    layout: Layout
    cp_comm_type: str | None
    vocab_chunk: int
    padded_vocab: int
    rows: tuple[Rendered, ...]
    lora: Any = None  # lora_adapter.LoraServing: a checked adapter the rollout serves

    def _rows(self, table: str, kind: str) -> tuple[Rendered, ...]:
        return tuple(r for r in self.rows if r.table == table and r.kind == kind and r.emitted)

    def args(self, table: str) -> tuple[str, ...]:
        """The table's arguments in row order, each distinct argument group once."""
        seen: list[tuple[str, ...]] = []
        for row in self._rows(table, "arg"):
            if row.args not in seen:
                seen.append(row.args)
        return tuple(a for group in seen for a in group)

    @property
    def env(self) -> dict[str, str]:
        return dict(r.args for r in self._rows("env", "env"))  # type: ignore[misc]

    @property
    def forbidden(self) -> tuple[Rendered, ...]:
        return tuple(r for r in self.rows if r.kind == "forbid" and r.emitted)

    @property
    def engine_side(self) -> tuple[Rendered, ...]:
        return tuple(r for r in self.rows if r.kind == "engine")

    @property
    def needs_newer_sglang(self) -> tuple[tuple[str, str], ...]:
        """(flag, where it comes from) for each emitted SGLang flag the release does not know."""
        flags = [a for a in self.args("sglang") if a in UNRELEASED_SGLANG_FLAGS]
        return tuple((f, UNRELEASED_SGLANG_FLAGS[f]) for f in flags)

    @property
    def sglang_release(self) -> str:
        return SGLANG_RELEASE

    @property
    def unproven_on_real_sglang(self) -> tuple[tuple[str, str], ...]:
        """(op, why) where a real SGLang rollout leaves the numerics proven here."""
        return REAL_SGLANG_UNPROVEN

    def trainer_conflicts(self, args: list[str] | tuple[str, ...]) -> list[str]:
        """Each of the user's own trainer arguments that undoes what this plan renders: another
        value for a rendered option (``--attention-dropout 0.1``) or a flag it forbids."""
        rendered: dict[str, str | None] = {}
        for table in ("megatron", "miles"):
            for row in self._rows(table, "arg"):
                rendered[row.args[0]] = row.args[1] if len(row.args) > 1 else None
        forbidden = {r.args[0]: r.reason for r in self.forbidden}
        out, i = [], 0
        while i < len(args):
            flag, value = args[i], None
            if "=" in flag:
                flag, value = flag.split("=", 1)
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                value, i = args[i + 1], i + 1
            i += 1
            if flag in forbidden:
                out.append(f"{flag}: never pass it under this contract ({forbidden[flag]})")
            elif flag in rendered and rendered[flag] is not None and value is not None:
                if not _same(value, rendered[flag]):
                    out.append(f"{flag} {value}: the plan renders {flag} {rendered[flag]}")
        return out

    def trainer_config_conflicts(self, config: Any) -> list[str]:
        """Each TransformerConfig field that differs from what this plan's rows set (e.g.
        megatron-core's default ``hidden_dropout=0.1``)."""
        out = []
        for row in self.rows:
            if row.table not in ("megatron", "miles") or row.kind != "arg" or row.fork_only:
                continue
            for name, value in row.config:
                if isinstance(value, bool | int | float) and hasattr(config, name):
                    actual = getattr(config, name)
                    if not _same(actual, value):
                        out.append(f"{name}={actual!r}: the plan sets {name}={value!r} "
                                   f"({row.args[0]})")  # fmt: skip
        return sorted(set(out))

    @property
    def rollout_command(self) -> tuple[str, ...]:
        lora = self.lora.sglang_args if self.lora is not None else ()
        return (*ROLLOUT_COMMAND, *self.args("sglang"), *lora)

    @property
    def trainer_command(self) -> tuple[str, ...]:
        """miles' one command: ``train.py`` with the Megatron and miles arguments and SGLang's
        under ``--sglang-`` (miles starts the engines); each flag once."""
        lora = self.lora.sglang_args if self.lora is not None else ()
        sglang = sglang_args_for_miles((*self.args("sglang"), *lora))
        return (*TRAINER_COMMAND, *once((*self.args("megatron"), *self.args("miles"), *sglang)))

    @property
    def you_add(self) -> tuple[tuple[str, str], ...]:
        """The arguments a miles launch needs that no contract knows: (arguments, what)."""
        return YOU_ADD


def _same(a: Any, b: Any) -> bool:
    """Equal as plan values: numbers by value (``0`` == ``0.0``), the rest as text."""
    try:
        return float(a) == float(b) and not isinstance(a, bool) ^ isinstance(b, bool)
    except (TypeError, ValueError):
        return str(a) == str(b)


def sources(subject: Subject) -> dict[str, Any]:
    """The namespaces table rows read from: resolved policies and contract data of one launch."""
    schema = generated.schema()
    cid, lay = subject.contract_id, subject.layout
    kind = CP_KINDS.get(subject.support.train_cp_kind)
    launcher = generated.runtime_policy("launcher").policy_for(cid)
    # Each engine's policy is resolved from the config that engine will see under this plan.
    sglang_config = SimpleNamespace(tp_size=lay.rollout_tp_size)
    megatron_config = SimpleNamespace(
        tensor_model_parallel_size=lay.tp,
        context_parallel_size=lay.cp,
        cp_comm_type=kind.comm_type if kind is not None and lay.cp > 1 else None,
        batch_invariant_mode=launcher.batch_invariant_mode,
    )
    return {
        "launcher": launcher,
        "sglang": generated.runtime_policy("sglang").policy_for(cid, sglang_config),
        "megatron": generated.runtime_policy("megatron").policy_for(cid, megatron_config),
        "identity": schema.get_contract_schema(cid),
        # every contract's numerics are defined without dropout (megatron-core defaults to 0.1)
        "trainer": SimpleNamespace(**TRAINER_DETERMINISM),
        "kernel": subject.kernel,
        "model": subject.dims,
        "layout": SimpleNamespace(
            tp=lay.tp,
            pp=lay.pp,
            cp=lay.cp,
            dp=lay.dp,
            ep=lay.ep if lay.ep > 1 else None,  # None: no flag (megatron's default, EP 1)
            expert_tp=1 if lay.ep > 1 else None,
            rollout_tp=lay.rollout_tp_size,
            rollout_dp=lay.rollout_dp,
        ),
    }


def lookup(values: Mapping[str, Any], source: str) -> Any:
    namespace, _, name = source.partition(".")
    return getattr(values[namespace], name)


def _choose(choices: Mapping[Any, Any], value: Any, source: str) -> Any:
    if value not in choices:
        known = ", ".join(map(repr, choices))
        raise PlanError(f"{source} = {value!r}: no rendering for this value (known: {known})")
    return choices[value]


def _config(pairs: tuple[tuple[str, Any], ...], value: Any) -> tuple[tuple[str, Any], ...]:
    return tuple((name, value if v == VALUE else v) for name, v in pairs)


def _flag(row: Flag, value: Any, values: Mapping[str, Any], env: Mapping[str, str]) -> dict:
    on = bool(value)
    return {
        "kind": "arg",
        "args": (row.flag,) if on else (),
        "config": _config(row.config, value) if on else (),
        "fork_only": row.fork_only,
    }


def _option(row: Option, value: Any, values: Mapping[str, Any], env: Mapping[str, str]) -> dict:
    if row.value_from is not None:
        shown = lookup(values, row.value_from) if value else None
    elif row.choices is not None and value is not None:
        shown = _choose(row.choices, value, row.source)
    else:
        shown = value
    on = shown is not None and shown is not False
    return {
        "kind": "arg",
        "args": (row.flag, str(shown)) if on else (),
        "config": _config(row.config, shown) if on else (),
        "fork_only": row.fork_only,
    }


def _choice(row: Choice, value: Any, values: Mapping[str, Any], env: Mapping[str, str]) -> dict:
    return {
        "kind": "arg",
        "args": tuple(_choose(row.choices, value, row.source)),
        "config": tuple(row.config.get(value, ())),
        "fork_only": row.fork_only,
    }


def _env(row: Env, value: Any, values: Mapping[str, Any], env: Mapping[str, str]) -> dict:
    if value is None:
        return {"kind": "env"}
    text = _choose(row.choices, value, row.source) if row.choices is not None else str(value)
    if row.keep_existing and row.name in env:
        note = f"kept from the environment (the policy's default is {text})"
        return {"kind": "env", "args": (row.name, env[row.name]), "note": note}
    return {"kind": "env", "args": (row.name, text)}


def _engine(row: EngineSide, value: Any, values: Mapping[str, Any], env: Mapping[str, str]) -> dict:
    return {"kind": "engine"}


def _forbid(row: Forbid, value: Any, values: Mapping[str, Any], env: Mapping[str, str]) -> dict:
    return {"kind": "forbid", "args": (row.flag,) if value else ()}


RENDERERS: Mapping[type, Callable[..., dict]] = {
    Flag: _flag,
    Option: _option,
    Choice: _choice,
    Env: _env,
    EngineSide: _engine,
    Forbid: _forbid,
}


def render_row(table: str, row: Row, values: Mapping[str, Any], env: Mapping[str, str]) -> Rendered:
    value = lookup(values, row.source)
    fields = RENDERERS[type(row)](row, value, values, env)
    return Rendered(table=table, source=row.source, value=value, reason=row.reason, **fields)


def build_plan(
    contract_id: str,
    layout: Layout,
    model: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> LaunchPlan:
    """Validate ``layout`` (LayoutError) and render every table for it.

    ``environ`` is the environment the launch inherits (variables the policy keeps if set);
    None means an empty one, so a plan depends only on its arguments unless asked.
    """
    subject = validate_layout(contract_id, layout, model)
    values = sources(subject)
    if not values["launcher"].enabled:
        raise PlanError(f"{contract_id}: the contract does not enable the launcher")
    env = dict(environ or {})
    rows = tuple(
        render_row(table, row, values, env)
        for table, table_rows in TABLES.items()
        for row in table_rows
    )
    schema = generated.schema()
    kind = CP_KINDS.get(subject.support.train_cp_kind)
    chunk = subject.kernel.logsoftmax_vocab_block
    return LaunchPlan(
        contract_id=contract_id,
        fingerprint=schema.FINGERPRINTS[contract_id],
        logprob_contract=values["identity"].logprob_contract,
        newer_contract=schema.newer_contract(contract_id),
        model=subject.dims,
        layout=layout,
        cp_comm_type=kind.comm_type if kind is not None and layout.cp > 1 else None,
        vocab_chunk=chunk,
        padded_vocab=padded_vocab(subject.dims.vocab_size, layout.tp, chunk),
        rows=rows,
    )
