"""Project configuration: where contracts live, where output goes, where each target vendors.

Read from ``contractgen.toml`` in the project root; every key is optional and defaults to
DESIGN.md's layout. A target's ``package`` is a relative POSIX path inside the sibling repo.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from .targets import TARGETS, get_target

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
    # Targets whose sibling repo keeps its own __init__.py (``init = false``): contractgen then
    # vendors only schema.py and runtime_policy.py into that package.
    no_init: frozenset[str] = frozenset()

    def package(self, target: str) -> str:
        return self.packages[get_target(target).name]

    def vendors_init(self, target: str) -> bool:
        return get_target(target).name not in self.no_init


def validate_package_path(value: str, where: str) -> str:
    """A vendored package path must be relative, normalised and stay inside the repo."""
    p = PurePosixPath(value)
    if (
        not value
        or p.is_absolute()
        or "\\" in value
        or any(part in ("..", ".", "") for part in value.split("/"))
    ):
        raise ConfigError(
            f"{where}: package path {value!r} must be a relative path inside the repo "
            "without '..', '.', empty parts or backslashes (e.g. 'python/sglang/srt/true_on_policy')"
        )
    return value


def load_config(root: Path) -> ProjectConfig:
    """Read ``contractgen.toml`` under ``root`` (if any) over the defaults."""
    path = root / CONFIG_NAME
    data: dict = {}
    if path.exists():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    unknown = set(data) - {"contracts", "generated", "targets"}
    if unknown:
        raise ConfigError(
            f"{path}: unknown keys {sorted(unknown)} (expected contracts, generated, targets)"
        )
    packages = {name: t.default_package for name, t in TARGETS.items()}
    no_init: set[str] = set()
    for name, entry in (data.get("targets") or {}).items():
        if name not in TARGETS:
            raise ConfigError(
                f"{path}: [targets.{name}]: unknown target (known: {', '.join(sorted(TARGETS))})"
            )
        if not isinstance(entry, dict) or set(entry) - {"package", "init"}:
            raise ConfigError(f"{path}: [targets.{name}]: only 'package' and 'init' may be set")
        if "init" in entry:
            if not isinstance(entry["init"], bool):
                raise ConfigError(
                    f"{path}: targets.{name}.init: must be true or false (got {entry['init']!r})"
                )
            if not entry["init"]:
                no_init.add(name)
        if "package" in entry:
            packages[name] = validate_package_path(
                str(entry["package"]), f"{path}: targets.{name}.package"
            )
    return ProjectConfig(
        root=root,
        contracts_dir=root / str(data.get("contracts", "contracts")),
        generated_dir=root / str(data.get("generated", "generated")),
        packages=packages,
        no_init=frozenset(no_init),
    )


def find_root(start: Path) -> Path:
    """The nearest directory at or above ``start`` holding contractgen.toml (else ``start``)."""
    for candidate in (start, *start.parents):
        if (candidate / CONFIG_NAME).is_file():
            return candidate
    return start
