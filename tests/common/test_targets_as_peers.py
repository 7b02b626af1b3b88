"""Targets are peers on one floor: a target folder (``adapters/<target>/``) imports the floor
(``adapters/common``), ``kernels/``, ``families/`` and the generated modules, never another target,
also not through ``importlib`` or registry name strings; the floor names no target; and the
modules under ``adapters/`` and ``contractgen/`` import each other without cycles (module-level
imports: the static graph)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# source folder -> its import name (pyproject's package-dir)
PACKAGES = {"contractgen": "contractgen", "adapters": "contractgen.adapters"}
FLOOR = ("common", "kernels", "families")
"""What every target builds from; every other folder under ``adapters/`` is a target."""
TARGETS = tuple(
    sorted(
        p.name
        for p in (ROOT / "adapters").iterdir()
        if (p / "__init__.py").is_file() and p.name not in FLOOR
    )
)
# calls whose string argument names a module or a registered target
NAMING_CALLS = {"import_module", "load_target", "get_target", "by_role", "adapter", "__import__"}


def _module_name(path: Path, folder: str) -> str:
    rel = path.relative_to(ROOT / folder).with_suffix("")
    parts = [PACKAGES[folder], *rel.parts]
    return ".".join(parts[:-1] if rel.name == "__init__" else parts)


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _top_level(tree: ast.Module):
    """Module-level statements, into ``if``/``try`` blocks but not ``if TYPE_CHECKING``."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                stack += node.body + node.orelse
        elif isinstance(node, ast.Try):
            stack += node.body + node.orelse + node.finalbody
            for h in node.handlers:
                stack += h.body
        else:
            yield node


def _imports(path: Path, module: str, everywhere: bool) -> set[str]:
    """Every module ``path`` imports (``from m import n``: ``m`` and ``m.n``); ``everywhere``:
    function-level imports too, else module-level ones only."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    nodes = ast.walk(tree) if everywhere else _top_level(tree)
    out: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, module, path.name == "__init__.py")
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return out


def _named_strings(path: Path, module: str) -> set[str]:
    """Module names and target names in string form: every string constant that is a dotted
    ``contractgen.adapters.…`` path, and the string arguments of import and registry calls
    (relative ``import_module`` names resolved against ``module``)."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    out = {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and n.value.startswith("contractgen.adapters.")
    }
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        fn = call.func
        name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
        if name not in NAMING_CALLS:
            continue
        for arg in call.args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                value = arg.value
                if value.startswith("."):
                    dots = len(value) - len(value.lstrip("."))
                    base = module.split(".")[: len(module.split(".")) - dots]
                    value = ".".join([*base, value.lstrip(".")])
                out.add(value)
    return out


def _target_of(name: str) -> str | None:
    """The target a module name or registry name belongs to (None: not a target's)."""
    if name in TARGETS:
        return name
    for t in TARGETS:
        if name == f"contractgen.adapters.{t}" or name.startswith(f"contractgen.adapters.{t}."):
            return t
    return None


def _files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _crossings(folder: Path, own: str | None, package: str | None = None) -> list[str]:
    """What the files under ``folder`` (package ``package``: default, its place under
    ``adapters/``) name of a target other than ``own``."""
    out = []
    for path in sorted(folder.rglob("*.py")):
        module = f"{package}.{path.stem}" if package else _module_name(path, "adapters")
        names = _imports(path, module, everywhere=True) | _named_strings(path, module)
        out += [
            f"{path.name}: {n}"
            for n in sorted(names)
            if (t := _target_of(n)) is not None and t != own
        ]
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_a_target_imports_no_other_target(target: str) -> None:
    assert _crossings(ROOT / "adapters" / target, target) == []


def test_the_floor_names_no_target() -> None:
    assert (ROOT / "adapters" / "common" / "__init__.py").is_file()
    assert _crossings(ROOT / "adapters" / "common", None) == []


def test_the_scan_sees_strings_and_relative_imports(tmp_path: Path) -> None:
    """Guard the guard: each way of reaching another target is caught."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import importlib\n"
        "from ..megatron import run_types\n"
        "def f():\n"
        "    importlib.import_module('..sglang.model', __package__)\n"
        "    importlib.import_module('contractgen.adapters.launcher')\n"
        "    return load_target('megatron')\n"
    )
    found = _crossings(tmp_path, "fsdp", package="contractgen.adapters.fsdp")
    assert {line.split(": ")[1] for line in found} >= {
        "contractgen.adapters.megatron",
        "contractgen.adapters.sglang.model",
        "contractgen.adapters.launcher",
        "megatron",
    }


def _graph() -> dict[str, set[str]]:
    modules: dict[str, Path] = {}
    for folder in PACKAGES:
        for path in _files(folder):
            modules[_module_name(path, folder)] = path
    graph = {}
    for name, path in modules.items():
        names = _imports(path, name, everywhere=False)
        # ``from pkg import mod`` depends on ``mod``, not on ``pkg``'s other modules
        used = {m for m in names if m in modules}
        used -= {m for m in used if any(n.startswith(m + ".") and n in modules for n in names)}
        graph[name] = used - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_under_adapters_and_contractgen() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_one() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_registered_target_provides_its_roles_names() -> None:
    """Each target's adapter module has every name ``ROLE_API`` lists for its role, and the
    floor's Protocols list the same names."""
    from contractgen.adapters.common import roles
    from contractgen.codegen.targets import BUILTIN, ROLE_API

    for target in BUILTIN.values():
        module = target.runtime()
        missing = [n for n in ROLE_API[target.role] if not hasattr(module, n)]
        assert missing == [], f"{target.name}: {missing}"
    for role, protocol in (("trainer", roles.TrainerTarget), ("rollout", roles.RolloutTarget)):
        assert set(protocol.__annotations__) == set(ROLE_API[role])
