"""The exact-zero parity gate: rollout logprobs vs trainer logprobs, bitwise, per layout."""

from ..codegen.targets import target_for_role

# The targets the gate compares, found by role (codegen/targets.py), never named here.
ROLLOUT: str = target_for_role("rollout").name
TRAINER: str = target_for_role("trainer").name
