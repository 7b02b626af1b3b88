"""The rules of ``contractgen breaking``: one registry entry per kind of change.

A rule is breaking when a repository that pinned a contract id (or imports the generated modules)
would see different numerics or a missing name after syncing. Every top-level contract field is
classified in ``FIELD_RULES``; a test checks the table covers the pydantic model, so a new field
cannot slip through unclassified.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    id: str
    breaking: bool
    summary: str


RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        # breaking: an existing id would mean something else, or an import would fail
        Rule(
            "CONTRACT_REMOVED", True, "a contract id was removed; repositories pinning it lose it"
        ),
        Rule(
            "PUBLIC_NAME_REMOVED",
            True,
            "a public name of a generated module was removed; code importing it breaks",
        ),
        Rule(
            "IDENTITY_CHANGED",
            True,
            "the identity of an existing id changed (family, kernel contracts, logprob contract, "
            "attention backends, sequence parallel)",
        ),
        Rule(
            "MODEL_PROFILE_CHANGED",
            True,
            "the model structure of an existing id changed (architectures, norm, qk_norm, "
            "activation, attention_bias, rope, reference model)",
        ),
        Rule("CHECKPOINT_CHANGED", True, "a known checkpoint's dimensions changed"),
        Rule("CHECKPOINT_REMOVED", True, "a known checkpoint was removed from an existing id"),
        Rule("PARALLEL_CHANGED", True, "the parallel layouts an existing id allows changed"),
        Rule("KERNEL_POLICY_CHANGED", True, "the kernel numerics of an existing id changed"),
        Rule("RUNTIME_POLICY_CHANGED", True, "a runtime switch of an existing id changed"),
        Rule(
            "LORA_CHANGED",
            True,
            "the LoRA adapters an existing id admits changed (target modules, rank or alpha "
            "limits, dropout)",
        ),
        # fine: reported as info (--verbose, JSON)
        Rule("CONTRACT_ADDED", False, "a new contract id"),
        Rule("CHECKPOINT_ADDED", False, "a new known checkpoint under an existing id"),
        Rule(
            "TARGET_POLICY_ADDED",
            False,
            "a runtime policy for a new target under an existing id (its own fingerprint; the "
            "numerics fingerprint and the other targets' policies are unchanged)",
        ),
        Rule("CHECKPOINTS_REORDERED", False, "known checkpoints listed in another order"),
        Rule("DESCRIPTION_CHANGED", False, "description edited (documentation only)"),
        Rule(
            "REFERENCE_MODEL_CHANGED",
            False,
            "the parity gate's tiny test model changed (a test fixture, not a model the contract "
            "runs in production; the gate re-proves parity on it)",
        ),
        Rule(
            "UNOBSERVABLE_NOTES_CHANGED",
            False,
            "notes on fields the gate cannot observe changed (documentation of the fault gate)",
        ),
        Rule("SUPERSEDES_CHANGED", False, "supersession link changed (metadata, not numerics)"),
        Rule(
            "FORMATTING_CHANGED", False, "comments or formatting only; the contract data is equal"
        ),
        Rule("PUBLIC_NAME_ADDED", False, "a new public name in a generated module"),
    )
}

# Top-level contract field -> rule for a change under an existing id. model_profile.checkpoints
# is compared per checkpoint name (CHECKPOINT_ADDED / _REMOVED / _CHANGED), not by this table.
FIELD_RULES: dict[str, str] = {
    "schema_version": "IDENTITY_CHANGED",
    "id": "IDENTITY_CHANGED",
    "family": "IDENTITY_CHANGED",
    "description": "DESCRIPTION_CHANGED",
    "supersedes": "SUPERSEDES_CHANGED",
    "identity": "IDENTITY_CHANGED",
    "model_profile": "MODEL_PROFILE_CHANGED",
    "parallel": "PARALLEL_CHANGED",
    "kernel_policy": "KERNEL_POLICY_CHANGED",
    "runtime_policy": "RUNTIME_POLICY_CHANGED",
    "lora": "LORA_CHANGED",
    "unobservable": "UNOBSERVABLE_NOTES_CHANGED",
}


# Sub-fields whose rule differs from their top-level field's (longest prefix wins).
SUBFIELD_RULES: dict[tuple[str, ...], str] = {
    ("model_profile", "reference_model"): "REFERENCE_MODEL_CHANGED",
}


def field_rule(path: str | tuple, added: bool = False) -> str:
    """The rule for a change at ``path`` (a top-level name or a path tuple; ``added``: the value
    is new there); an unclassified field is a contractgen bug."""
    parts = (path,) if isinstance(path, str) else tuple(path)
    if added and len(parts) == 2 and parts[0] == "runtime_policy":
        return "TARGET_POLICY_ADDED"
    for n in range(len(parts), 1, -1):
        if parts[:n] in SUBFIELD_RULES:
            return SUBFIELD_RULES[parts[:n]]
    try:
        return FIELD_RULES[parts[0]]
    except KeyError:
        raise LookupError(
            f"contract field {parts[0]!r} has no breaking-change rule; add it to FIELD_RULES"
        ) from None
