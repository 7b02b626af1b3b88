"""The importable ``KernelPolicy`` against the contract schema's kernel policy: same field names in
the same order, same types (Literal choices included), and a converter that keeps every value. The
drift check is run on a class with a field added and one with a field removed, to show it fails."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Annotated, Any, Literal

import pytest

from contractgen.adapters.kernels import KernelPolicy
from contractgen.codegen.vendored import load_target
from contractgen.schema import models


def _plain(tp: Any) -> Any:
    """``tp`` without ``Annotated`` wrappers (the schema's ``PositiveInt`` is an annotated int),
    unions rebuilt from their plain members."""
    if typing.get_origin(tp) is Annotated:
        return _plain(typing.get_args(tp)[0])
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        members = [_plain(a) for a in typing.get_args(tp)]
        out = members[0]
        for m in members[1:]:
            out = out | m
        return out
    return tp


def _schema_fields() -> dict[str, Any]:
    return {n: _plain(f.annotation) for n, f in models.KernelPolicy.model_fields.items()}


def _typed_fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: _plain(hints[f.name]) for f in dataclasses.fields(cls)}


def _drift(cls: type) -> list[str]:
    """Every difference between ``cls``'s fields and the schema's: one line per field."""
    schema, typed = _schema_fields(), _typed_fields(cls)
    out = [f"{n}: in the schema, not in {cls.__name__}" for n in schema if n not in typed]
    out += [f"{n}: in {cls.__name__}, not in the schema" for n in typed if n not in schema]
    out += [
        f"{n}: schema {schema[n]!r}, {cls.__name__} {typed[n]!r}"
        for n in schema
        if n in typed and schema[n] != typed[n]
    ]
    if not out and list(schema) != list(typed):
        out.append("same fields in another order")
    return out


def test_the_typed_policy_has_the_schemas_fields_and_types():
    assert _drift(KernelPolicy) == []


def test_a_field_missing_from_the_typed_policy_is_drift():
    hints = typing.get_type_hints(KernelPolicy)
    fields = [
        (f.name, hints[f.name], dataclasses.field(default=f.default))
        for f in dataclasses.fields(KernelPolicy)
        if f.name != "logsoftmax_vocab_block"
    ]
    short = dataclasses.make_dataclass("Short", fields, namespace={"__module__": __name__})
    assert _drift(short) == ["logsoftmax_vocab_block: in the schema, not in Short"]


def test_a_field_added_to_the_typed_policy_is_drift():
    long = dataclasses.make_dataclass(
        "Long",
        [("softmax_tile", int | None, dataclasses.field(default=None))],
        bases=(KernelPolicy,),
        frozen=True,
        namespace={"__module__": __name__},
    )
    assert _drift(long) == ["softmax_tile: in Long, not in the schema"]


def test_a_changed_literal_is_drift():
    changed = dataclasses.make_dataclass(
        "Changed",
        [("all_reduce", Literal["fixed_tree"])],
        bases=(KernelPolicy,),
        frozen=True,
        namespace={"__module__": __name__},
    )
    assert _drift(changed) == [
        f"all_reduce: schema {Literal['fixed_tree', 'nccl']!r}, "
        f"Changed {Literal['fixed_tree']!r}"
    ]


@pytest.mark.parametrize("target", ["sglang", "megatron", "fsdp"])
def test_of_keeps_every_value_of_every_shipped_contract(target):
    schema = load_target(target).schema
    for contract in schema.CONTRACT_IDS:
        generated = schema.kernel_policy_for(contract)
        typed = KernelPolicy.of(generated)
        assert dataclasses.asdict(typed) == dataclasses.asdict(generated)
        assert KernelPolicy.of(typed) is typed


def test_of_names_a_missing_attribute():
    class Old:
        dense_math_dtype = "bfloat16"

    with pytest.raises(AttributeError, match="matmul_k_block"):
        KernelPolicy.of(Old())
