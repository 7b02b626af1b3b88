"""Load the generated (vendored) modules of a target, as the sibling repos would import them.

Adapters read contract policy only through these modules, never through the pydantic models: what
is tested here is the code that ships. The files are read from this project's ``generated/``
directory (kept fresh by ``contractgen check`` in CI); when contractgen runs from a wheel without
that directory, the same bytes are rendered in memory from the built-in contracts.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .paths import builtin_config

_LOCK = threading.Lock()


@dataclass(frozen=True)
class GeneratedTarget:
    """The generated package of one target: its ``schema`` and ``runtime_policy`` modules."""

    target: str
    package: types.ModuleType
    schema: types.ModuleType
    runtime_policy: types.ModuleType
    origin: str  # "generated/" or "rendered in memory"


def _files_for(target: str) -> tuple[dict[str, bytes], str, str]:
    config = builtin_config()
    base = f"{target}/{config.package(target)}"
    on_disk = config.generated_dir / base
    names = ("__init__.py", "schema.py", "runtime_policy.py")
    if all((on_disk / n).is_file() for n in names):
        return {n: (on_disk / n).read_bytes() for n in names}, str(on_disk), "generated/"
    from .codegen.render import render
    from .schema.loader import load_contracts

    rendered = render(load_contracts(config.contracts_dir, config.root), config)
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
    from .codegen.targets import get_target

    get_target(target)  # unknown names raise with the list of known targets
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
        exec(compile(files["__init__.py"], package.__file__, "exec"), package.__dict__)
    return GeneratedTarget(target, package, schema, policy, origin)
