"""The gate's one way to its targets: found in the registry by role, never named.

``codegen/targets.py`` is the registry (the built-in targets plus the active project's plugins);
this module picks the gate's rollout target and the trainer targets it runs, and hands out their
adapter modules, whose names (``ROLE_API``) are all the gate calls.
"""

from __future__ import annotations

import types

from ..codegen.targets import UnknownTargetError, by_role, get_target, targets_for_role
from ..codegen.vendored import load_target


def rollout_target() -> str:
    """The rollout target the gate runs: the role's default (today the one rollout target)."""
    return by_role("rollout").name


def trainer_targets(contract_id: str) -> list[str]:
    """Every trainer target whose generated policy carries ``contract_id``, built-ins first."""
    return [
        t.name
        for t in targets_for_role("trainer")
        if contract_id in load_target(t.name).schema.CONTRACT_IDS
    ]


def parse_trainers(text: str) -> list[str]:
    """``--trainers a,b``: trainer target names, in order, each once; an unknown one raises
    ``UnknownTargetError`` listing the trainer targets."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UnknownTargetError(text, [t.name for t in targets_for_role("trainer")], "trainer")
    return [by_role("trainer", n).name for n in dict.fromkeys(names)]


def adapter(name: str) -> types.ModuleType:
    """The adapter module of target ``name`` (``ROLE_API[role]`` names on it)."""
    return get_target(name).runtime()


def rollout_adapter() -> types.ModuleType:
    return adapter(rollout_target())


def runs_layout(name: str, layout) -> bool:
    """Whether trainer target ``name`` runs ``layout``: every axis the layout uses (``fsdp``
    for an FSDP layout, else ``tp`` and any other axis above 1) is one of its adapter's
    ``LAYOUT_AXES``."""
    used = {k for k, v in layout.sizes.items() if v > 1 and k != "fsdp"}
    used |= {"fsdp"} if layout.fsdp else {"tp"}
    return used <= set(adapter(name).LAYOUT_AXES)
