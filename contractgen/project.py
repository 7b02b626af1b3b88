"""Load a contractgen project: its config, its contracts and their rendered files."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .codegen.config import ProjectConfig, find_root, load_config
from .codegen.paths import builtin_config
from .codegen.render import render, render_vendored
from .schema.loader import LoadedContract, load_contracts


@dataclass
class Project:
    config: ProjectConfig
    contracts: list[LoadedContract]

    @cached_property
    def rendered(self) -> dict[str, bytes]:
        """contractgen's own build (``generated/``): every target with every contract."""
        return render(self.contracts, self.config)

    @cached_property
    def vendored(self) -> dict[str, bytes]:
        """What sibling repos vendor, keyed ``<target>/<path in the repo>``: each target with
        only the contracts it implements (``contractgen.toml``'s ``contracts``)."""
        out: dict[str, bytes] = {}
        for name in sorted(self.config.targets):
            for rel, content in render_vendored(self.contracts, self.config, name).items():
                out[f"{name}/{rel}"] = content
        return out

    def implemented(self, target: str) -> tuple[str, ...]:
        """The contract ids ``target`` implements under this project's config."""
        return self.config.implemented(target, [lc.id for lc in self.contracts])

    def contract(self, contract_id: str) -> LoadedContract:
        for lc in self.contracts:
            if lc.id == contract_id:
                return lc
        known = ", ".join(lc.id for lc in self.contracts)
        raise KeyError(f"unknown contract {contract_id!r} (known: {known})")


def open_project(root: Path | None = None, contracts_dir: Path | None = None) -> Project:
    """The project at ``root`` (default: nearest contractgen.toml above cwd, else the built-in)."""
    if root is None:
        found = find_root(Path.cwd())
        config = load_config(found) if (found / "contractgen.toml").is_file() else builtin_config()
    elif not root.is_dir():
        raise FileNotFoundError(
            f"--root {root}: no such folder; give the folder that holds contractgen.toml "
            "(or leave --root out to use the nearest one above the current directory)"
        )
    else:
        config = load_config(root)
    if contracts_dir is not None:
        builtin = config.root.resolve() == builtin_config().root.resolve()
        config = dataclasses.replace(config, contracts_dir=contracts_dir)
        if builtin:  # contractgen's own contract sets name its contracts, not these
            config = dataclasses.replace(config, declared={}, declared_where={})
    project = Project(config, load_contracts(config.contracts_dir, config.root))
    config.check_declared([lc.id for lc in project.contracts])
    return project
