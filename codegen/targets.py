"""The three targets: one registry entry each, looked up by name.

A target names the sibling repository, where the vendored package lives in it by default, and the
public class names its ``runtime_policy.py`` must keep so the generated module can replace the
hand-kept one.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    # Other names the public module gives its contract class (kept so imports keep working).
    contract_class_aliases: tuple[str, ...] = ()
    # DEFAULT_RUNTIME_POLICY (no contract active) values that are not False/None in the public
    # module: with no contract the engine must behave exactly as it did before.
    off_values: tuple[tuple[str, bool | str], ...] = ()
    # Parameter names of the public module: the engine config a policy is resolved from
    # (SGLang: server_args) and the id ``get_true_on_policy_contract`` takes (miles: name).
    config_param: str = "config"
    lookup_param: str = "contract_name"


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
        ),
        Target(
            name="megatron",
            repo="Megatron-LM",
            default_package="megatron/core/true_on_policy",
            policy_class="MegatronTrueOnPolicyRuntimePolicy",
            contract_class="MegatronTrueOnPolicyContract",
            id_constant_is_object=False,
            summary="Megatron trainer",
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
            contract_class="LauncherTrueOnPolicyContract",
            id_constant_is_object=True,
            summary="Miles launcher",
            contract_class_aliases=("TrueOnPolicyContract",),
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
