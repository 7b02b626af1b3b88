"""Project configuration: where contracts live, where output goes, where each target vendors.

Read from ``contractgen.toml`` in the project root; every key is optional and defaults to
DESIGN.md's layout. A target's ``package`` is a relative POSIX path inside the sibling repo.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .formatters import parse_format
from .targets import BUILTIN, Target, UnknownTargetError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONFIG_NAME = "contractgen.toml"


class ConfigError(ValueError):
    """The project configuration is invalid; the message names the key and the fix."""


@dataclass(frozen=True)
class ProjectConfig:
    root: Path
    contracts_dir: Path
    generated_dir: Path
    packages: dict[str, str] = field(default_factory=dict)  # target -> vendored package path
    # Targets whose sibling repo keeps its own __init__.py (``init = false``, the default: every
    # public repo has one): contractgen then vendors schema.py, runtime_policy.py and contracts.py
    # into that package and leaves __init__.py alone.
    no_init: frozenset[str] = frozenset()
    # where ``generated`` is set (``contractgen.toml:LINE:COL``), for errors about that folder
    generated_where: str = f"{CONFIG_NAME}:1:1"
    # The contracts each target repo implements (``contracts = [...]``); a target left out
    # vendors every contract of the project. Its vendored modules accept only these ids.
    declared: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # where each target's ``contracts`` is set, for errors about an id
    declared_where: dict[str, str] = field(default_factory=dict)
    # Targets that also vendor the kernel module (``kernels = true``; default off):
    # ``tp_invariant_ops.py``, our Triton linear and tree all-reduce with SGLang's signatures.
    kernels: frozenset[str] = frozenset()
    # where each target's ``kernels`` is set, for errors about it
    kernels_where: dict[str, str] = field(default_factory=dict)
    # Targets this project adds (``[targets.NAME] plugin = "file.py"``), after the built-ins.
    plugins: dict[str, Target] = field(default_factory=dict)
    # Each target repo's formatters (``[targets.NAME.format]``): target -> ((tool, options), …)
    formats: dict[str, tuple] = field(default_factory=dict)

    @property
    def targets(self) -> dict[str, Target]:
        """The target registry of this project: the built-in targets, then its plugins."""
        return {**BUILTIN, **self.plugins}

    def target(self, name: str) -> Target:
        try:
            return self.targets[name]
        except KeyError:
            raise UnknownTargetError(name, list(self.targets)) from None

    def package(self, target: str) -> str:
        return self.packages[self.target(target).name]

    def vendors_init(self, target: str) -> bool:
        return self.target(target).name not in self.no_init

    def vendors_kernels(self, target: str) -> bool:
        """Whether ``target`` opted in to the vendored kernel module (``kernels = true``)."""
        return self.target(target).name in self.kernels

    def declares(self, target: str) -> bool:
        """Whether ``contractgen.toml`` names the contracts ``target`` implements."""
        return self.target(target).name in self.declared

    def implemented(self, target: str, known: list[str] | tuple[str, ...]) -> tuple[str, ...]:
        """The ids ``target`` implements: its declared set, else every id in ``known``."""
        name = self.target(target).name
        return self.declared[name] if name in self.declared else tuple(sorted(known))

    def check_declared(self, known: list[str] | tuple[str, ...]) -> None:
        """ConfigError naming the first declared id that no contract file defines."""
        for target, ids in sorted(self.declared.items()):
            missing = [cid for cid in ids if cid not in known]
            if missing:
                where = self.declared_where.get(target, f"{CONFIG_NAME}:1:1")
                raise ConfigError(
                    f"{where}: targets.{target}.contracts: no contract {missing[0]!r} in the "
                    f"project (known: {', '.join(sorted(known))})"
                )


def validate_package_path(value: str, where: str) -> str:
    """A vendored package path must be relative, normalised and stay inside the repo."""
    problem = _relative_path_problem(value)
    if problem:
        raise ConfigError(
            f"{where}: package path {value!r} {problem} (e.g. 'python/sglang/srt/true_on_policy')"
        )
    return value


def _relative_path_problem(value: str) -> str:
    """Why ``value`` is not a relative, normalised POSIX path below a folder ('' if it is)."""
    p = PurePosixPath(value)
    if (
        not value
        or p.is_absolute()
        or "\\" in value
        or any(part in ("..", ".", "") for part in value.split("/"))
    ):
        return (
            "must be a relative path inside the repo without '..', '.', empty parts or backslashes"
        )
    return ""


def _position(text: str, key: str, table: str = "") -> tuple[int, int]:
    """Line and column of ``key =`` (inside ``[table]`` when given) in a TOML file; 1:1 if unseen."""
    lines = text.splitlines()
    start = 0
    if table:
        header = re.compile(r"^\s*\[\s*" + re.escape(table).replace(r"\.", r"\s*\.\s*") + r"\s*\]")
        start = next((i + 1 for i, line in enumerate(lines) if header.match(line)), 0)
    pattern = re.compile(r"^(\s*)[\"']?" + re.escape(key) + r"[\"']?\s*=")
    for i in range(start, len(lines)):
        match = pattern.match(lines[i])
        if match:
            return i + 1, len(match.group(1)) + 1
        if table and lines[i].lstrip().startswith("[") and i >= start:
            break
    if table:
        header_line = start if start else 1
        return header_line, 1
    return 1, 1


def load_config(root: Path) -> ProjectConfig:
    """Read ``contractgen.toml`` under ``root`` (if any) over the defaults.

    Every problem is one line, ``contractgen.toml:LINE:COL: key: message``.
    """
    shown = CONFIG_NAME
    text, data = _read_toml(root / CONFIG_NAME, shown)

    def error(key: str, message: str, table: str = "", leaf: str = "") -> ConfigError:
        line, col = _position(text, leaf or key.rsplit(".", 1)[-1], table)
        return ConfigError(f"{shown}:{line}:{col}: {key}: {message}")

    unknown = sorted(set(data) - {"contracts", "generated", "targets"})
    if unknown:
        raise error(unknown[0], "unknown key (expected contracts, generated, targets)")
    folders = _folders(data, error)
    targets = data.get("targets") or {}
    if not isinstance(targets, dict):
        raise error(
            "targets",
            f'must be a table of targets (got {targets!r}); write [targets.sglang] package = "…"',
        )
    plugins: dict[str, Target] = {}
    for name, entry in targets.items():
        if isinstance(entry, dict) and "plugin" in entry:
            plugins[name] = _load_plugin(root, name, entry["plugin"], error)
    settings = _TargetSettings.defaults({**BUILTIN, **plugins}, text, error)
    for name, entry in targets.items():
        settings.read(name, entry)
    return ProjectConfig(
        root=root,
        contracts_dir=root / folders["contracts"],
        generated_dir=root / folders["generated"],
        packages=settings.packages,
        no_init=frozenset(settings.no_init),
        generated_where="{}:{}:{}".format(shown, *_position(text, "generated")),
        declared=settings.declared,
        declared_where=settings.declared_where,
        kernels=frozenset(settings.kernels),
        kernels_where=settings.kernels_where,
        plugins=plugins,
        formats=settings.formats,
    )


def _read_toml(path: Path, shown: str) -> tuple[str, dict]:
    """``(text, table)`` of the config file (empty when there is none)."""
    if not path.exists():
        return "", {}
    try:
        text = path.read_text(encoding="utf-8")
        return text, tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{shown}:1:1: not UTF-8 text ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        line, col = (match.group(1), match.group(2)) if match else ("1", "1")
        message = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        raise ConfigError(f"{shown}:{line}:{col}: invalid TOML: {message}") from None


def _folders(data: dict, error: Callable[..., ConfigError]) -> dict[str, str]:
    """The ``contracts`` and ``generated`` folder paths, checked."""
    folders = {}
    for key in ("contracts", "generated"):
        value = data.get(key, key)
        if not isinstance(value, str) or not value:
            raise error(key, f'must be a folder path (got {value!r}), e.g. {key} = "{key}"')
        folders[key] = value
    problem = _relative_path_problem(folders["generated"])
    if problem:  # generate deletes what no contract produces there: never outside the project
        raise error(
            "generated",
            f"{folders['generated']!r} {problem.replace('the repo', 'the project')}; it must be "
            "a folder of its own (e.g. generated = \"generated\")",
        )
    if folders["generated"] == folders["contracts"]:
        raise error("generated", 'must not be the contracts folder (e.g. generated = "generated")')
    return folders


@dataclass
class _TargetSettings:
    """Every target's settings as ``[targets.NAME]`` tables leave them, over its defaults."""

    known: dict[str, Target]
    text: str
    error: Callable[..., ConfigError]
    packages: dict[str, str]
    no_init: set[str]
    formats: dict[str, tuple]
    declared: dict[str, tuple[str, ...]] = field(default_factory=dict)
    declared_where: dict[str, str] = field(default_factory=dict)
    kernels: set[str] = field(default_factory=set)
    kernels_where: dict[str, str] = field(default_factory=dict)

    @classmethod
    def defaults(
        cls, known: dict[str, Target], text: str, error: Callable[..., ConfigError]
    ) -> _TargetSettings:
        return cls(
            known=known,
            text=text,
            error=error,
            packages={name: t.default_package for name, t in known.items()},
            no_init={name for name, t in known.items() if not t.default_init},
            formats={n: t.default_format for n, t in known.items() if t.default_format},
        )

    def where(self, key: str, table: str) -> str:
        return "{}:{}:{}".format(CONFIG_NAME, *_position(self.text, key, table))

    def read(self, name: str, entry: object) -> None:
        """Apply ``[targets.NAME]`` (``entry``) over the defaults."""
        table, error = f"targets.{name}", self.error
        if name not in self.known:
            raise error(
                table,
                f"unknown target (known: {', '.join(sorted(self.known))}); a new target is a "
                'Python file defining TARGET, named by plugin = "path/to/target.py"',
                table,
            )
        keys = {"package", "init", "contracts", "kernels", "plugin", "format"}
        if not isinstance(entry, dict) or set(entry) - keys:
            raise error(
                table,
                "only 'package', 'init', 'contracts', 'kernels', 'plugin' and 'format' may be set",
                table,
            )
        if "format" in entry:
            try:
                self.formats[name] = parse_format(entry["format"], f"{table}.format")
            except ValueError as exc:
                raise error(f"{table}.format", str(exc), f"{table}.format", "format") from None
        if "kernels" in entry:
            self._read_kernels(name, entry["kernels"], table)
        if "contracts" in entry:
            self._read_contracts(name, entry["contracts"], table)
        if "init" in entry:
            if not isinstance(entry["init"], bool):
                raise error(
                    f"{table}.init", f"must be true or false (got {entry['init']!r})", table
                )
            if entry["init"]:
                self.no_init.discard(name)
            else:
                self.no_init.add(name)
        if "package" in entry:
            value = entry["package"]
            problem = (
                _relative_path_problem(value) if isinstance(value, str) else "must be a string"
            )
            if problem:
                raise error(
                    f"{table}.package",
                    f"package path {value!r} {problem} (e.g. 'python/sglang/srt/true_on_policy')",
                    table,
                )
            self.packages[name] = value

    def _read_kernels(self, name: str, value: object, table: str) -> None:
        if not isinstance(value, bool):
            raise self.error(
                f"{table}.kernels",
                f"must be true or false (got {value!r}); kernels = true vendors "
                "tp_invariant_ops.py (the Triton linear and tree all-reduce)",
                table,
            )
        if value:
            self.kernels.add(name)
        self.kernels_where[name] = self.where("kernels", table)

    def _read_contracts(self, name: str, ids: object, table: str) -> None:
        if (
            not isinstance(ids, list)
            or not ids
            or not all(isinstance(i, str) and i for i in ids)
            or len(set(ids)) != len(ids)
        ):
            raise self.error(
                f"{table}.contracts",
                f"must be a non-empty list of distinct contract ids (got {ids!r}), e.g. "
                'contracts = ["qwen3_dense_true_on_policy_v1"]',
                table,
            )
        self.declared[name] = tuple(sorted(ids))
        self.declared_where[name] = self.where("contracts", table)


def _load_plugin(root: Path, name: str, value: object, error) -> Target:
    """The ``TARGET`` a ``plugin = "file.py"`` entry names (a path relative to the project root),
    its template folder made absolute; every problem is one ``contractgen.toml`` line."""
    import dataclasses

    key, table = f"targets.{name}.plugin", f"targets.{name}"
    problem = _relative_path_problem(value) if isinstance(value, str) else "must be a string"
    if not problem and not str(value).endswith(".py"):
        problem = "must name a .py file"
    if problem:
        raise error(key, f"{value!r} {problem} (e.g. plugin = 'targets/{name}/target.py')", table)
    path = (root / str(value)).resolve()
    if not path.is_file():
        raise error(key, f"{path} does not exist (a Python file defining TARGET)", table)
    if name in BUILTIN:
        raise error(key, f"{name!r} is a built-in target; give the plugin another name", table)
    try:
        target = _plugin_target(str(path), path.stat().st_mtime_ns)
    except Exception as exc:  # the plugin's own error, shown where it is named
        raise error(key, f"{path} failed to load: {type(exc).__name__}: {exc}", table) from None
    if not isinstance(target, Target) or target.name != name:
        got = getattr(target, "name", None) if isinstance(target, Target) else type(target)
        raise error(
            key,
            f"{path} must define TARGET = Target(name={name!r}, …) from "
            f"contractgen.codegen.targets (got {got!r})",
            table,
        )
    templates = path.parent / (target.templates or "templates")
    if not templates.is_dir():
        raise error(key, f"{path}: template folder {templates} does not exist", table)
    return dataclasses.replace(target, templates=str(templates))


_PLUGINS: dict[tuple[str, int], object] = {}


def _plugin_target(path: str, mtime: int) -> object:
    """``TARGET`` of the plugin file at ``path`` (executed once per version of the file)."""
    import runpy

    if (path, mtime) not in _PLUGINS:
        _PLUGINS[path, mtime] = runpy.run_path(path).get("TARGET")
    return _PLUGINS[path, mtime]


def find_root(start: Path) -> Path:
    """The nearest directory at or above ``start`` holding contractgen.toml (else ``start``)."""
    for candidate in (start, *start.parents):
        if (candidate / CONFIG_NAME).is_file():
            return candidate
    return start
