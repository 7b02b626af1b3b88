"""The target registry: one entry per target, looked up by name or by role, several per role.

A role says what a target does in a true-on-policy run: ``rollout`` (generates and scores
sequences), ``trainer`` (recomputes logprobs and steps), ``launcher`` (renders the launch). The
parity gate pairs every rollout target with every trainer target it is asked for, by role, never
by name.

A target names the sibling repository, where the vendored package lives in it by default, the
public class names its ``runtime_policy.py`` must keep so the generated module can replace the
hand-kept one, its template folder, and its adapter: the module whose names (``ROLE_API``) the
gate and the commands reach its runtime through.

The shipped targets are ``BUILTIN``. A project adds one without touching contractgen: a Python
file defining ``TARGET = Target(...)``, named by ``plugin = "path.py"`` under
``[targets.NAME]`` in its ``contractgen.toml`` (``codegen/config.py``). ``registry(config)`` is
the built-in entries plus that project's plugins; ``get_target`` and ``targets_for_role`` look up
in it (the active project's, ``codegen.vendored.active_config``, when no config is given).
"""

from __future__ import annotations

import importlib
import types
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .config import ProjectConfig

Role = Literal["rollout", "trainer", "launcher"]
ROLES: tuple[Role, ...] = ("rollout", "trainer", "launcher")

# The names a target's adapter module exposes for its role: what the gate and the commands use
# (the adapter imports heavy modules lazily, on first use of a name).
ROLE_API: dict[str, tuple[str, ...]] = {
    "rollout": (
        "MLP_BLOCKS",  # the MLP blocks (Family.layer_blocks) its model implements
        "ModelArch",
        "ReferenceModel",
        "RolloutEngine",
        "Request",
        "random_weights",
        "load_checkpoint",
        "check_checkpoint",
        "check_weight_files",
        "RolloutSession",  # the rank processes kept alive: .run(RolloutJob) -> RolloutResult
        "arch_of",  # the model a contract's weights or checkpoint hold
        "model_arch",
        "policies",  # the kernel and runtime policy the ranks run under
    ),
    "trainer": (
        "MLP_BLOCKS",
        "LAYOUT_AXES",  # the Layout axes it runs (tp/pp/cp/ep, or fsdp): the gate's layouts for it
        "TrainerSession",  # started per layout: .start(), .logprobs(sequences, run), .close()
        "TrainerRun",
        "TrainerFault",
        "TrainBatch",
        "TrainInit",
        "OptimizerSettings",
    ),
    "launcher": ("check_handshake", "handshake_report", "HandshakeError", "build_plan"),
}

TEMPLATES = Path(__file__).parent / "templates"


# radixark/miles' pyproject.toml: black at 119 and isort (profile black, 119)
MILES_FORMAT = (
    ("black", (("line-length", 119),)),
    ("isort", (("known-first-party", ("miles", "miles_plugins")), ("line-length", 119),
               ("profile", "black"))),
)  # fmt: skip
# radixark/Megatron-LM miles-main's pyproject.toml: black at 100, quotes and commas as written
FORK_FORMAT = (
    ("black", (("line-length", 100), ("skip-magic-trailing-comma", True),
               ("skip-string-normalization", True))),
)  # fmt: skip


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
    # The formatters the public repo runs (``[targets.NAME.format]`` overrides them):
    # ((tool, ((setting, value), …)), …); every vendored file is rendered in a form they keep.
    default_format: tuple = ()
    # The module the target's runtime is reached through (``ROLE_API[role]`` names).
    adapter: str = ""
    # Its template folder (``runtime_policy.py.j2``, ``__init__.py.j2``); default
    # ``codegen/templates/<name>``. A plugin's is relative to its file.
    templates: str = ""
    # The contract's ``runtime_policy.<section>`` it renders; default its own name. A target that
    # runs another's numerics under its own name (a fork, a test double) names that one.
    policy_section: str = ""

    @property
    def section(self) -> str:
        return self.policy_section or self.name

    @property
    def template_dir(self) -> Path:
        return Path(self.templates) if self.templates else TEMPLATES / self.name

    def runtime(self) -> types.ModuleType:
        """The adapter module (imported on first use; heavy parts load lazily behind it)."""
        if not self.adapter:
            raise LookupError(f"target {self.name!r} names no adapter module (Target.adapter)")
        return importlib.import_module(self.adapter)


BUILTIN: dict[str, Target] = {
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
            adapter="contractgen.adapters.sglang",
        ),
        Target(
            name="megatron",
            repo="Megatron-LM",
            # The public fork's path (there is no megatron/core/true_on_policy on any branch).
            default_package="miles_megatron_plugins/true_on_policy",
            default_format=FORK_FORMAT,
            policy_class="MegatronTrueOnPolicyRuntimePolicy",
            contract_class="MegatronTrueOnPolicyContract",
            id_constant_is_object=False,
            summary="Megatron trainer",
            role="trainer",
            adapter="contractgen.adapters.megatron",
            unsupported="Unsupported Megatron true-on-policy contract",
            # With no contract: Megatron's own attention ("default", as the public module has it).
            off_values=(
                ("attention_backend", "default"),
                ("cast_qk_norm_input_before_weight_mul", True),
            ),
        ),
        Target(
            name="fsdp",
            repo="miles",
            # beside miles' FSDP backend (miles/backends/fsdp_utils), not its launcher package
            default_package="miles/backends/fsdp_utils/true_on_policy",
            default_format=MILES_FORMAT,
            policy_class="FsdpTrueOnPolicyRuntimePolicy",
            contract_class="FsdpTrueOnPolicyContract",
            id_constant_is_object=False,
            summary="FSDP2 trainer (transformers models)",
            role="trainer",
            adapter="contractgen.adapters.fsdp",
            unsupported="Unsupported FSDP true-on-policy contract",
        ),
        Target(
            name="launcher",
            repo="miles",
            default_package="miles/true_on_policy",
            default_format=MILES_FORMAT,
            policy_class="LauncherTrueOnPolicyRuntimePolicy",
            contract_class="TrueOnPolicyContract",  # miles' own class name
            id_constant_is_object=True,
            summary="Miles launcher",
            role="launcher",
            contract_class_aliases=("LauncherTrueOnPolicyContract",),
            lookup_param="name",
            adapter="contractgen.adapters.launcher",
        ),
    )
}


# The shipped targets under their historical name (read-only: plugins live in a config).
TARGETS = BUILTIN


def registry(config: ProjectConfig | None = None) -> dict[str, Target]:
    """Every target of ``config``'s project (default: the active one): the built-in entries,
    then its plugins (``[targets.NAME] plugin = …``), in that order."""
    if config is None:
        config = active_project_config()
    return config.targets


# The module that knows which project is active (``codegen.vendored``), looked up by name when
# first needed: this registry is below the config in the import graph and never imports back.
SELECTION_MODULE = __name__.rsplit(".", 1)[0] + ".vendored"


def active_project_config() -> ProjectConfig:
    """The active project's config (``codegen.vendored.active_config``)."""
    return importlib.import_module(SELECTION_MODULE).active_config()[0]


class UnknownTargetError(KeyError):
    def __init__(self, name: str, known: list[str] | None = None, role: str | None = None):
        super().__init__(name)
        self.name = name
        self.known = sorted(BUILTIN) if known is None else sorted(known)
        self.role = role

    def __str__(self) -> str:
        what = f"{self.role} target" if self.role else "target"
        return f"unknown {what} {self.name!r} (known: {', '.join(self.known)})"


def get_target(name: str, config: ProjectConfig | None = None) -> Target:
    """The target called ``name``; an unknown name raises, listing the known ones."""
    found = registry(config) if config is not None or name not in BUILTIN else BUILTIN
    try:
        return found[name]
    except KeyError:
        raise UnknownTargetError(name, list(found)) from None


def targets_for_role(role: Role, config: ProjectConfig | None = None) -> list[Target]:
    """Every target with ``role``, built-ins first (the first is the role's default)."""
    return [t for t in registry(config).values() if t.role == role]


def target_for_role(role: Role, config: ProjectConfig | None = None) -> Target:
    """The role's default target: its first entry (``targets_for_role``)."""
    found = targets_for_role(role, config)
    if not found:
        roles = ", ".join(f"{t.name}={t.role}" for t in registry(config).values())
        raise LookupError(f"no target with role {role!r} ({roles})")
    return found[0]


def by_role(role: Role, name: str | None = None, config: ProjectConfig | None = None) -> Target:
    """The ``role`` target called ``name`` (default: the role's default target); a name that is
    not a ``role`` target raises, listing the ones that are."""
    if name is None:
        return target_for_role(role, config)
    found = {t.name: t for t in targets_for_role(role, config)}
    if name not in found:
        raise UnknownTargetError(name, list(found), role)
    return found[name]
