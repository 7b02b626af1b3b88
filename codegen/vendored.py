"""Load the generated (vendored) modules of a target, as the sibling repos would import them.

Adapters read contract policy only through these modules, never through the pydantic models: what
is tested here is the code that ships. The files are read from this project's ``generated/``
directory (kept fresh by ``contractgen check`` in CI); when contractgen runs from a wheel without
that directory, the same bytes are rendered in memory from the built-in contracts.

``use_project`` points every later ``load_target`` (in this process and in the worker processes
it starts, through two environment variables) at another project: ``--root``, ``--contracts`` or
a ``contractgen.toml`` found above the current directory. Its modules are rendered in memory
from its contracts, so a stale ``generated/`` there cannot mislead a command. It returns the
selection it replaced, which ``restore_project`` puts back: a command run in process (a test's
``CliRunner``, a script calling ``main``) leaves no project behind for later code to read.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import threading
import types
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .config import ProjectConfig, load_config
from .paths import builtin_config

_LOCK = threading.Lock()
ROOT_ENV, CONTRACTS_ENV = "CONTRACTGEN_PROJECT_ROOT", "CONTRACTGEN_PROJECT_CONTRACTS"


def use_project(config: ProjectConfig) -> dict[str, str]:
    """Make ``load_target`` read ``config``'s project (here and in processes started later);
    the selection it replaced, for ``restore_project``."""
    builtin = builtin_config()
    same = (config.root.resolve(), config.contracts_dir.resolve()) == (
        builtin.root.resolve(),
        builtin.contracts_dir.resolve(),
    )
    wanted = {} if same else {ROOT_ENV: str(config.root.resolve()),
                              CONTRACTS_ENV: str(config.contracts_dir.resolve())}  # fmt: skip
    current = _selection()
    _select(wanted)
    return current


def restore_project(previous: dict[str, str]) -> None:
    """Put back the selection ``use_project`` returned."""
    _select(previous)


def _selection() -> dict[str, str]:
    return {k: os.environ[k] for k in (ROOT_ENV, CONTRACTS_ENV) if k in os.environ}


def _select(wanted: dict[str, str]) -> None:
    if wanted != _selection():
        for key in (ROOT_ENV, CONTRACTS_ENV):
            os.environ.pop(key, None)
        os.environ.update(wanted)
        load_target.cache_clear()


def active_config() -> tuple[ProjectConfig, bool]:
    """The project ``load_target`` reads, and whether it is contractgen's own (built-in) one."""
    root = os.environ.get(ROOT_ENV)
    if not root:
        return builtin_config(), True
    config = load_config(Path(root))
    contracts = os.environ.get(CONTRACTS_ENV)
    if contracts:
        config = dataclasses.replace(config, contracts_dir=Path(contracts))
    return config, False


@dataclass(frozen=True)
class GeneratedTarget:
    """The generated package of one target: its ``schema`` and ``runtime_policy`` modules."""

    target: str
    package: types.ModuleType
    schema: types.ModuleType
    runtime_policy: types.ModuleType
    origin: str  # "generated/" or "rendered in memory"


def _files_for(target: str) -> tuple[dict[str, bytes], str, str]:
    config, builtin = active_config()
    base = f"{target}/{config.package(target)}"
    on_disk = config.generated_dir / base
    names = ("__init__.py", "schema.py", "runtime_policy.py")
    if builtin and all((on_disk / n).is_file() for n in names):
        return {n: (on_disk / n).read_bytes() for n in names}, str(on_disk), "generated/"
    from ..schema.loader import load_contracts
    from .render import render

    rendered = render(load_contracts(config.contracts_dir, config.root), config)
    names = tuple(n for n in names if f"{base}/{n}" in rendered)  # init = false leaves __init__ out
    return {n: rendered[f"{base}/{n}"] for n in names}, f"<rendered {base}>", "rendered in memory"


def _load_module(name: str, source: bytes, filename: str, package: str | None) -> types.ModuleType:
    spec = importlib.util.spec_from_loader(name, loader=None, origin=filename)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    module.__file__ = filename
    if package is None:  # the package itself
        module.__path__ = []  # type: ignore[attr-defined]
        module.__package__ = name
    else:
        module.__package__ = package
    sys.modules[name] = module
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


@cache
def load_target(target: str) -> GeneratedTarget:
    """Import ``generated/<target>/…`` as package ``contractgen._vendored.<target>``."""
    active_config()[0].target(target)  # unknown names raise with the list of known targets
    with _LOCK:
        files, where, origin = _files_for(target)
        pkg_name = f"contractgen._vendored.{target}"
        if "contractgen._vendored" not in sys.modules:
            root = types.ModuleType("contractgen._vendored")
            root.__path__ = []  # type: ignore[attr-defined]
            sys.modules["contractgen._vendored"] = root
        package = types.ModuleType(pkg_name)
        package.__path__ = []  # type: ignore[attr-defined]
        package.__package__ = pkg_name
        package.__file__ = str(Path(where) / "__init__.py")
        sys.modules[pkg_name] = package
        schema = _load_module(
            f"{pkg_name}.schema", files["schema.py"], f"{where}/schema.py", pkg_name
        )
        policy = _load_module(
            f"{pkg_name}.runtime_policy",
            files["runtime_policy.py"],
            f"{where}/runtime_policy.py",
            pkg_name,
        )
        if "__init__.py" in files:
            exec(compile(files["__init__.py"], package.__file__, "exec"), package.__dict__)
    return GeneratedTarget(target, package, schema, policy, origin)
