"""The row kinds of a launch table (``tables.py``): how one typed policy field becomes an argument
or environment variable.

``Flag`` (emitted when the value is true), ``Option`` (flag + value), ``Choice`` (flags per
enumerated value), ``Env``, ``EngineSide`` (no flag: the engine applies it itself once the
contract is named) and ``Forbid`` (a flag that must not be passed while the value is true).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The value of the row's own source, for ``config`` pairs.
VALUE = "<value>"


@dataclass(frozen=True)
class Flag:
    """``flag`` alone, when the source value is true."""

    source: str
    flag: str
    reason: str
    # (TransformerConfig field, value) pairs the flag sets in Megatron (VALUE: the source value).
    config: tuple[tuple[str, Any], ...] = ()
    fork_only: bool = False  # the flag exists only in the true-on-policy forks


@dataclass(frozen=True)
class Option:
    """``flag VALUE``. VALUE is the source value, translated by ``choices`` when given, or the
    value of ``value_from`` when the (boolean) source is true. None emits nothing."""

    source: str
    flag: str
    reason: str
    choices: Mapping[Any, Any] | None = None
    value_from: str | None = None
    config: tuple[tuple[str, Any], ...] = ()
    fork_only: bool = False


@dataclass(frozen=True)
class Choice:
    """The flags ``choices[value]`` (possibly none) for an enumerated source value."""

    source: str
    choices: Mapping[Any, tuple[str, ...]]
    reason: str
    config: Mapping[Any, tuple[tuple[str, Any], ...]] = field(default_factory=dict)
    fork_only: bool = False


@dataclass(frozen=True)
class Env:
    """Environment variable ``name``; ``choices`` translates the value (e.g. bool -> "0"/"1")."""

    source: str
    name: str
    reason: str
    choices: Mapping[Any, str] | None = None
    keep_existing: bool = False  # an existing value in the environment wins


@dataclass(frozen=True)
class EngineSide:
    """No flag: the engine applies this field itself once the contract is named."""

    source: str
    reason: str


@dataclass(frozen=True)
class Forbid:
    """``flag`` must not be passed while the source value is true."""

    source: str
    flag: str
    reason: str


Row = Flag | Option | Choice | Env | EngineSide | Forbid
