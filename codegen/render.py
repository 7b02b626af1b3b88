"""Render contracts into vendored files: a pure function from contracts to ``{path: bytes}``.

``generate`` writes this map, ``check`` compares it, ``sync`` copies it into sibling repos; all
three use the same map. Output is deterministic: sorted contracts and keys, LF newlines, no
timestamps, and every file is parsed with ``ast`` before it is returned.
"""

from __future__ import annotations

import ast
import typing
from dataclasses import dataclass
from pathlib import PurePosixPath

import jinja2

from ..schema.loader import LoadedContract
from ..schema.models import (
    HYBRID_DIMS_FIELDS,
    MOE_DIMS_FIELDS,
    OPTIONAL_KERNEL_FIELDS,
    REFERENCE_ONLY_DIMS_FIELDS,
    SCHEMA_VERSION,
    KernelPolicy,
    ModelDims,
    When,
)
from ..schema.models import FromConfig as FromConfigRule
from .config import CONFIG_NAME, ConfigError, ProjectConfig
from .fingerprint import GENERATOR_FORMAT, contract_fingerprint, header, policy_fingerprints
from .formatters import FormatConflict, Formatter, common_form, formatters_of
from .literals import HOLD, INDENT, py_literal, py_str, seq_literal
from .public_api import (
    PUBLIC_CONTRACT_NAMES,
    PUBLIC_IDENTITIES,
    PUBLIC_KERNEL_CONTRACTS,
    PUBLIC_LOGPROB_CONTRACTS,
    PUBLIC_MODEL_FAMILIES,
)
from .targets import TEMPLATES, Target

FILES = ("__init__.py", "contracts.py", "schema.py", "runtime_policy.py")


class RenderError(RuntimeError):
    """A template produced invalid Python; a bug in contractgen, never in a contract."""


@dataclass(frozen=True)
class FieldDoc:
    name: str
    type: str
    doc: str
    off: str = "None"
    optional: bool = False  # absent from contracts that do not use it: a None default


def _environment(config: ProjectConfig) -> jinja2.Environment:
    """Templates by ``<target>/<file>``: each target's own folder (``Target.template_dir``), and
    ``common/`` and ``kernels/`` from contractgen's."""
    own = {name: jinja2.FileSystemLoader(str(t.template_dir)) for name, t in config.targets.items()}
    return jinja2.Environment(
        loader=jinja2.ChoiceLoader(
            [jinja2.PrefixLoader(own), jinja2.FileSystemLoader(str(TEMPLATES))]
        ),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _call_arg_tuple(keyword: str, items: list[str]) -> str:
    """A tuple literal passed as ``keyword=`` inside a module-level call, as ruff formats it:
    one line when it fits in 100 columns, else one item a line."""
    if len(items) == 1:
        return f"({items[0]},)"
    one_line = f"({', '.join(items)})"
    if len(f"{INDENT}{keyword}={one_line},") <= 100:
        return one_line
    body = "".join(f"{INDENT * 2}{item},\n" for item in items)
    return f"(\n{body}{INDENT})"


def _annotation(annotation: object) -> str:
    """Python source for a pydantic field annotation, as a stdlib dataclass type."""
    text = {
        "int": "int",
        "float": "float",
        "bool": "bool",
        "str": "str",
    }
    name = getattr(annotation, "__name__", None)
    if name in text:
        return text[name]
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(args) == 1 and type(None) in typing.get_args(annotation):
        inner = _annotation(args[0])  # an optional field: T | None
        return inner if inner.endswith("| None") else f"{inner} | None"
    if typing.get_origin(annotation) is typing.Annotated:
        return _annotation(args[0])
    raw = str(annotation)
    if "tuple" in raw:
        return "tuple[int, ...] | None" if "None" in raw else "tuple[int, ...]"
    if "bool" in raw:
        return "bool"
    return "str | None" if "None" in raw else "str"


def _field_docs(
    model: type, skip: tuple[str, ...] = (), optional: tuple[str, ...] = ()
) -> list[FieldDoc]:
    return [
        FieldDoc(
            name,
            _annotation(info.annotation),
            " ".join((info.description or "").split()),
            optional=name in optional,
        )
        for name, info in model.model_fields.items()
        if name not in skip
    ]


def _policy_fields(target: Target, contracts: list[LoadedContract]) -> list[FieldDoc]:
    """Runtime-policy fields of a target, typed from the values every contract gives them."""
    from ..schema.models import TARGET_POLICY_MODELS

    model = TARGET_POLICY_MODELS[target.section]
    off_values = dict(target.off_values)
    out = []
    sections = [getattr(c.contract.runtime_policy, target.section) for c in contracts]
    for name, info in model.model_fields.items():
        values = [_values(section, name) for section in sections if section is not None]
        flat = [v for vs in values for v in vs]
        is_bool = all(isinstance(v, bool) for v in flat)
        typ = "bool" if is_bool else "str | None"
        off = py_literal(off_values[name]) if name in off_values else "False" if is_bool else "None"
        out.append(FieldDoc(name, typ, " ".join((info.description or "").split()), off))
    return out


def _values(policy: object, field: str) -> list[object]:
    value = getattr(policy, field)
    if isinstance(value, When):
        return [value.value, value.otherwise]
    if isinstance(value, FromConfigRule):
        return [value.default]
    return [value]


def _rule(value: object) -> str:
    if isinstance(value, When):
        parts = ["when", value.when, value.value, value.otherwise]
    elif isinstance(value, FromConfigRule):
        parts = ["config", value.from_config, value.default]
    else:
        parts = ["const", value]
    return "(" + ", ".join(py_literal(p) for p in parts) + ")"


# The rule of every field of a target a contract has no section for: off (``enabled`` False
# makes ``policy_for`` return the target's ``DEFAULT_RUNTIME_POLICY``).
_OFF_RULE = '("const", False)'


def _rules_literal(target: Target, contracts: list[LoadedContract]) -> str:
    from ..schema.models import TARGET_POLICY_MODELS

    fields = list(TARGET_POLICY_MODELS[target.section].model_fields)
    lines = ["{"]
    for lc in contracts:
        policy = getattr(lc.contract.runtime_policy, target.section)
        lines.append(f"{INDENT}{py_str(lc.id)}: {{")
        for name in fields:  # a contract without the target's section: off there
            rule = _OFF_RULE if policy is None else _rule(getattr(policy, name))
            lines.append(f"{INDENT * 2}{py_str(name)}: {rule},")
        lines.append(f"{INDENT}}},")
    lines.append("}")
    return "\n".join(lines)


def _contract_context(lc: LoadedContract) -> dict:
    c = lc.contract
    const = c.id.upper()
    lit = {
        "family": py_str(c.family),
        "logprob_contract": py_str(c.identity.logprob_contract),
        "sglang_attention_backend": py_str(c.identity.sglang_attention_backend),
        "fsdp_attention_implementation": py_str(c.identity.fsdp_attention_implementation),
        "disable_megatron_sequence_parallel": py_literal(
            c.identity.disable_megatron_sequence_parallel
        ),
        "supersedes": py_literal(c.supersedes),
    }
    version_suffix = const.rsplit("_V", 1)
    public_alias = f"{version_suffix[0]}_CONTRACT" if version_suffix[-1] == "1" else None
    return {
        "id": c.id,
        "id_literal": py_str(c.id),
        "const": const,
        "lit": lit,
        "kernel_contracts_tuple": _call_arg_tuple(
            "required_kernel_contracts", [py_str(k) for k in c.identity.kernel_contracts]
        ),
        "public_alias": public_alias,
    }


def _public_identity(contract_id: str, values: dict[str, object]) -> dict:
    """Template context of a public identity constant that no contract here defines."""
    return {
        "const": contract_id.upper(),
        "id_literal": py_str(contract_id),
        "lit": {k: py_literal(v) for k, v in values.items() if k != "required_kernel_contracts"},
        # one line (it fits): _seq's multi-line form is indented for module level only
        "kernel_contracts_tuple": "("
        + ", ".join(py_str(str(k)) for k in values["required_kernel_contracts"])  # type: ignore[union-attr]
        + ("," if len(values["required_kernel_contracts"]) == 1 else "")  # type: ignore[arg-type]
        + ")",
    }


def _contracts_module_names(target: Target, schema_ctx: dict) -> tuple[list[str], list[str]]:
    """Names ``contracts.py`` re-exports: (from runtime_policy, from schema), each sorted as
    ruff's isort orders them (constants, then classes, then functions)."""
    runtime = [
        "DEFAULT_RUNTIME_POLICY",
        target.policy_class,
        target.contract_class,
        *target.contract_class_aliases,
        "get_true_on_policy_contract",
        "policy_for",
        "resolve_true_on_policy_runtime_policy",
        "validate_true_on_policy_contract",
    ]
    for c in schema_ctx["contracts"]:
        runtime += [c["const"], f"{c['const']}_CONTRACT"]
        if c["public_alias"] and c["public_alias"] != f"{c['const']}_CONTRACT":
            runtime.append(c["public_alias"])
    schema = [
        "CONTRACT_IDS",
        "KernelContract",
        "LogprobContract",
        "ModelFamily",
        "TrueOnPolicyContractName",
        "TrueOnPolicyContractSchema",
        "UnknownContractError",
        *(f"{c['const']}_SCHEMA" for c in schema_ctx["contracts"]),
        *(f"{c['const']}_SCHEMA" for c in schema_ctx["public_identities"]),
    ]
    return _isort(runtime), _isort(schema)


def _isort(names: list[str]) -> list[str]:
    """ruff's isort order for names in one import: CONSTANTS, then Classes, then functions."""

    def key(name: str) -> tuple[int, str]:
        kind = 0 if name.isupper() else 1 if name[:1].isupper() else 2
        return (kind, name)

    return sorted(set(names), key=key)


def _union(values: set[str]) -> str:
    return seq_literal([py_str(v) for v in sorted(values)], "[", "]")


def _schema_context(contracts: list[LoadedContract]) -> dict:
    data = {lc.id: lc.contract.model_dump(mode="json") for lc in contracts}
    superseded_by = {
        lc.contract.supersedes: lc.id for lc in contracts if lc.contract.supersedes is not None
    }
    return {
        "schema_version": SCHEMA_VERSION,
        "generator_format": GENERATOR_FORMAT,
        "contracts": [_contract_context(lc) for lc in contracts],
        "ids_union": _union({lc.id for lc in contracts} | set(PUBLIC_CONTRACT_NAMES)),
        "families_union": _union(
            {lc.contract.family for lc in contracts} | set(PUBLIC_MODEL_FAMILIES)
        ),
        "kernel_contracts_union": _union(
            {k for lc in contracts for k in lc.contract.identity.kernel_contracts}
            | set(PUBLIC_KERNEL_CONTRACTS)
        ),
        "logprob_contracts_union": _union(
            {lc.contract.identity.logprob_contract for lc in contracts}
            | set(PUBLIC_LOGPROB_CONTRACTS)
        ),
        "public_identities": [
            _public_identity(cid, values)
            for cid, values in sorted(PUBLIC_IDENTITIES.items())
            if cid not in {lc.id for lc in contracts}  # a contract with that id takes over
        ],
        "ids_tuple": seq_literal([py_str(lc.id) for lc in contracts], "(", ")"),
        "hold": HOLD,  # ``_SCHEMAS`` of one contract whose id is 14..22 long: no form black keeps
        "kernel_fields": _field_docs(KernelPolicy, optional=OPTIONAL_KERNEL_FIELDS),
        "dims_fields": _field_docs(ModelDims, skip=("rope", *OPTIONAL_DIMS_FIELDS)),
        "dims_optional_fields": _field_docs(ModelDims, skip=_not(ModelDims, OPTIONAL_DIMS_FIELDS)),
        # ``before``: the columns of the template's ``NAME: type = `` on the literal's line
        "contract_data": py_literal(data, before=len("CONTRACT_DATA: dict[str, dict] = ")),
        "fingerprints": py_literal(
            {cid: contract_fingerprint(d) for cid, d in data.items()},
            before=len("FINGERPRINTS: dict[str, str] = "),
        ),
        "policy_fingerprints": py_literal(
            {cid: policy_fingerprints(d) for cid, d in data.items()},
            before=len("POLICY_FINGERPRINTS: dict[str, dict[str, str]] = "),
        ),
        "superseded_by": py_literal(superseded_by, before=len("SUPERSEDED_BY: dict[str, str] = ")),
    }


OPTIONAL_DIMS_FIELDS = (*MOE_DIMS_FIELDS, *HYBRID_DIMS_FIELDS, *REFERENCE_ONLY_DIMS_FIELDS)


def _not(model: type, names: tuple[str, ...]) -> tuple[str, ...]:
    """The fields of ``model`` not in ``names``."""
    return tuple(f for f in model.model_fields if f not in names)


def _source_names(contracts: list[LoadedContract], config: ProjectConfig) -> list[str]:
    names = []
    for lc in contracts:
        try:
            names.append(lc.path.resolve().relative_to(config.root.resolve()).as_posix())
        except ValueError:
            names.append(lc.path.name)
    return sorted(names)


def _stamp(
    body: str,
    sources: list[str],
    fingerprints: dict[str, str],
    path: str,
    parsed: set[bytes],
    formatters: tuple[Formatter, ...] = (),
) -> bytes:
    if formatters:  # the one form every repo's formatter keeps, found before the stamp
        try:
            body = common_form(body, formatters, path)
        except FormatConflict as exc:
            raise ConfigError(f"{CONFIG_NAME}: {exc}") from None
    encoded = body.encode("utf-8")
    if encoded not in parsed:  # schema.py is the same body for every target: parse it once
        try:
            ast.parse(encoded, filename=path)
        except SyntaxError as exc:  # a template bug: never write such a file
            raise RenderError(f"{path}: generated code does not parse: {exc}") from exc
        parsed.add(encoded)
    stamped = header(sources, fingerprints, encoded) + encoded
    # the header is comments: the whole file must stay as it is (one round, cached like the body)
    if formatters and common_form(stamped.decode("utf-8"), formatters, path).encode() != stamped:
        raise RenderError(f"{path}: {', '.join(f.describe() for f in formatters)} reformat the "
                          "stamped file")  # fmt: skip
    return stamped


def _render_target(
    env: jinja2.Environment,
    target: Target,
    selected: list[LoadedContract],
    every: list[LoadedContract],
    config: ProjectConfig,
    schema_bodies: dict[tuple[str, ...], str],
    parsed: set[bytes],
    base: PurePosixPath,
    with_init: bool,
) -> dict[str, bytes]:
    """One target's files for the contracts ``selected`` (field types from ``every``)."""
    key = tuple(lc.id for lc in selected)
    schema_ctx = _schema_context(selected)
    if key not in schema_bodies:  # schema.py is one body per contract set, in every target
        schema_bodies[key] = env.get_template("common/schema.py.j2").render(**schema_ctx)
    sources = _source_names(selected, config)
    fingerprints = {
        lc.id: contract_fingerprint(lc.contract.model_dump(mode="json")) for lc in selected
    }
    runtime_names, schema_names = _contracts_module_names(target, schema_ctx)
    ctx = {
        "target": target,
        "runtime_names": runtime_names,
        "schema_names": schema_names,
        "all_names": _isort(runtime_names + schema_names),
        "contracts": schema_ctx["contracts"],
        "policy_fields": _policy_fields(target, every),
        "rules": _rules_literal(target, selected),
    }
    name = target.name
    bodies = {
        "schema.py": schema_bodies[key],
        "runtime_policy.py": env.get_template(f"{name}/runtime_policy.py.j2").render(**ctx),
        "__init__.py": env.get_template(f"{name}/__init__.py.j2").render(**ctx),
        "contracts.py": env.get_template("common/contracts.py.j2").render(**ctx),
    }
    out: dict[str, bytes] = {}
    for file in FILES:
        if file == "__init__.py" and not with_init:
            continue  # the sibling repo keeps its own package __init__.py
        path = str(base / file)
        # schema.py is shared by every repo (byte-identical): every repo's formatters keep it;
        # the other files go to this target's repo only: its formatters keep them
        shared = file == "schema.py"
        formatters = formatters_of(config.formats, None if shared else [name])
        out[path] = _stamp(bodies[file], sources, fingerprints, path, parsed, formatters)
    return out


def render(contracts: list[LoadedContract], config: ProjectConfig) -> dict[str, bytes]:
    """``{relative path under generated/: bytes}``: every target with every contract.

    This is contractgen's own build (the in-tree adapters and the parity gate run every shipped
    contract from it), with every file, ``__init__.py`` included. What a sibling repo vendors is
    ``render_vendored``: only the contracts its target implements.
    """
    contracts = sorted(contracts, key=lambda lc: lc.id)
    env = _environment(config)
    out: dict[str, bytes] = {}
    parsed: set[bytes] = set()
    bodies: dict[tuple[str, ...], str] = {}
    targets = config.targets
    for name in sorted(targets):
        base = PurePosixPath(name) / config.package(name)
        out.update(
            _render_target(
                env, targets[name], contracts, contracts, config, bodies, parsed, base, True
            )
        )
    return dict(sorted(out.items()))


def selected_contracts(
    contracts: list[LoadedContract], config: ProjectConfig, target: str
) -> list[LoadedContract]:
    """The contracts ``target`` implements (``contractgen.toml``'s ``contracts``, else all)."""
    ids = set(config.implemented(target, [lc.id for lc in contracts]))
    config.check_declared([lc.id for lc in contracts])
    return sorted((lc for lc in contracts if lc.id in ids), key=lambda lc: lc.id)


def render_vendored(
    contracts: list[LoadedContract], config: ProjectConfig, target: str
) -> dict[str, bytes]:
    """``{path inside the sibling repo: bytes}``: what ``sync`` writes for ``target``.

    Only the contracts the target implements are vendored (their data, constants and registry),
    and ``__init__.py`` only where the config says ``init = true``.
    """
    every = sorted(contracts, key=lambda lc: lc.id)
    selected = selected_contracts(every, config, target)
    env = _environment(config)
    base = PurePosixPath(config.package(target))
    files = _render_target(
        env, config.target(target), selected, every, config, {}, set(), base,
        with_init=config.vendors_init(target),
    )  # fmt: skip
    if config.vendors_kernels(target):
        files.update(_render_kernels(env, target, selected, config, base))
    return dict(sorted(files.items()))


def _render_kernels(
    env: jinja2.Environment,
    target: str,
    selected: list[LoadedContract],
    config: ProjectConfig,
    base: PurePosixPath,
) -> dict[str, bytes]:
    """The opt-in kernel module (``kernels = true``), stamped like every vendored file."""
    from .kernels_module import (
        MODULE_NAME,
        KernelsModuleError,
        check_numerics,
        render_kernels_module,
    )

    where = config.kernels_where.get(target, f"{CONFIG_NAME}:1:1")
    try:
        check_numerics(
            {lc.id: lc.contract.kernel_policy.model_dump(mode="json") for lc in selected},
            f"{where}: targets.{target}.kernels",
        )
    except KernelsModuleError as exc:
        raise ConfigError(str(exc)) from None
    try:
        body, kernel_sources = render_kernels_module(env, [lc.id for lc in selected])
    except KernelsModuleError as exc:  # our kernel source lacks what the template calls
        raise RenderError(str(exc)) from None
    fingerprints = {
        lc.id: contract_fingerprint(lc.contract.model_dump(mode="json")) for lc in selected
    }
    path = str(base / MODULE_NAME)
    sources = [*_source_names(selected, config), *kernel_sources]
    own = formatters_of(config.formats, [target])
    return {path: _stamp(body, sources, fingerprints, path, set(), own)}
