"""The three targets: one registry entry each, looked up by name or by role.

A role says what a target does in a true-on-policy run: ``rollout`` (generates and scores
sequences), ``trainer`` (recomputes logprobs and steps), ``launcher`` (renders the launch). The
parity gate pairs the rollout target with the trainer target by role, never by name.

A target names the sibling repository, where the vendored package lives in it by default, and the
public class names its ``runtime_policy.py`` must keep so the generated module can replace the
hand-kept one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["rollout", "trainer", "launcher"]


@dataclass(frozen=True)
class Target:
    name: str
    repo: str
    default_package: str
    policy_class: str
    contract_class: str
    # In miles the bare ``<ID>`` constant is the contract schema object; in Megatron-LM and SGLang
    # it is the id string. Kept as the public repos have it.
    id_constant_is_object: bool
    summary: str
    role: Role
    # Other names the public module gives its contract class (kept so imports keep working).
    contract_class_aliases: tuple[str, ...] = ()
    # DEFAULT_RUNTIME_POLICY (no contract active) values that are not False/None in the public
    # module: with no contract the engine must behave exactly as it did before.
    off_values: tuple[tuple[str, bool | str], ...] = ()
    # Parameter names of the public module: the engine config a policy is resolved from
    # (SGLang: server_args) and the id ``get_true_on_policy_contract`` takes (miles: name).
    config_param: str = "config"
    lookup_param: str = "contract_name"
    # validate_true_on_policy_contract's parameter: the id (Megatron-LM: contract_name) or the
    # server config (SGLang: server_args); the generated function accepts either.
    validate_param: str = "contract_name"
    # How the public module refuses an id it does not implement (a ValueError), before
    # ``Supported contracts: …``.
    unsupported: str = "Unsupported true-on-policy contract"
    # Whether a sibling repo gets contractgen's __init__.py by default: each public repo keeps
    # its own (miles and SGLang re-export launch/config helpers, Megatron-LM a docstring).
    default_init: bool = False


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            name="sglang",
            repo="sglang",
            default_package="python/sglang/srt/true_on_policy",
            policy_class="SGLangTrueOnPolicyRuntimePolicy",
            contract_class="SGLangTrueOnPolicyContract",
            id_constant_is_object=False,
            summary="SGLang rollout engine",
            config_param="server_args",
            validate_param="server_args",
            unsupported="Unsupported SGLang true-on-policy contract",
            role="rollout",
        ),
        Target(
            name="megatron",
            repo="Megatron-LM",
            # The public fork's path (there is no megatron/core/true_on_policy on any branch).
            default_package="miles_megatron_plugins/true_on_policy",
            policy_class="MegatronTrueOnPolicyRuntimePolicy",
            contract_class="MegatronTrueOnPolicyContract",
            id_constant_is_object=False,
            summary="Megatron trainer",
            role="trainer",
            unsupported="Unsupported Megatron true-on-policy contract",
            # With no contract: Megatron's own attention ("default", as the public module has it).
            off_values=(
                ("attention_backend", "default"),
                ("cast_qk_norm_input_before_weight_mul", True),
            ),
        ),
        Target(
            name="launcher",
            repo="miles",
            default_package="miles/true_on_policy",
            policy_class="LauncherTrueOnPolicyRuntimePolicy",
            contract_class="TrueOnPolicyContract",  # miles' own class name
            id_constant_is_object=True,
            summary="Miles launcher",
            role="launcher",
            contract_class_aliases=("LauncherTrueOnPolicyContract",),
            lookup_param="name",
        ),
    )
}


class UnknownTargetError(KeyError):
    def __init__(self, name: str):
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown target {self.name!r} (known: {', '.join(sorted(TARGETS))})"


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise UnknownTargetError(name) from None


def target_for_role(role: Role) -> Target:
    """The one target with ``role``; a role with none or several is a registry bug, named."""
    found = [t for t in TARGETS.values() if t.role == role]
    if len(found) != 1:
        roles = ", ".join(f"{t.name}={t.role}" for t in TARGETS.values())
        raise LookupError(f"expected one target with role {role!r}, found {len(found)} ({roles})")
    return found[0]
