"""Which contracts each side of a launch implements, and the refusal when one side does not.

A target repo implements the contracts ``contractgen.toml`` declares for it (its vendored modules
accept only those). A launch needs all three to implement the contract: the rollout (SGLang), the
trainer (Megatron-LM) and the launcher (miles); otherwise one engine would run numerics the other
was never built for, and the run would not be on-policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# (side, target, repo) in the order a refusal names them: the caller looks them up in the
# target registry (``contractgen plan``: each role's default target)
Sides = Sequence[tuple[str, str, str]]


def not_implemented(
    contract_id: str, implemented: Mapping[str, tuple[str, ...]], sides: Sides
) -> list[str]:
    """One line per side whose target does not implement ``contract_id`` (empty: all do)."""
    lines = []
    for side, target, repo in sides:
        ids = implemented.get(target, ())
        if contract_id not in ids:
            shown = ", ".join(ids) or "no contract"
            lines.append(
                f"the {side} ({repo}; contractgen.toml targets.{target}.contracts) implements "
                f"only {shown}"
            )
    return lines


def refusal(
    contract_id: str, implemented: Mapping[str, tuple[str, ...]], sides: Sides
) -> str | None:
    """The message refusing a launch of ``contract_id`` (None when every side implements it)."""
    lines = not_implemented(contract_id, implemented, sides)
    if not lines:
        return None
    return "\n".join(
        [
            f"refusing to plan {contract_id}: not every side implements it:",
            *(f"  {line}" for line in lines),
            "a run under a contract one side does not implement is not on-policy; plan a "
            "contract every side implements, or declare it in that target's `contracts` once "
            "its repo implements it",
        ]
    )
