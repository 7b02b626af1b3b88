"""The house's shape in numbers: what a restructure is measured by, before and after.

    .venv/bin/python tools/house_metrics.py [--json]

Source lines per folder (Python outside tests/ and generated/), modules over 400 / 500 lines, the
longest functions, function-level imports, ``# fmt: skip`` lines, static import cycles among the
package's modules, imports from one adapter target into another, README lines, files under
benchmarks/. Repeated blocks are counted apart, with pylint's ``symilar`` (see ``--help``).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# import package -> folder, as pyproject.toml's package-dir maps them
PACKAGES = {
    "contractgen": "contractgen",
    "contractgen.schema": "schema",
    "contractgen.codegen": "codegen",
    "contractgen.adapters": "adapters",
}
TARGETS = ("sglang", "megatron", "fsdp", "launcher", "vllm")
SKIP_PARTS = {"tests", "generated", ".venv", ".venv-vllm", "scratch", "build", "__pycache__"}


def tracked_python() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / p for p in out if not SKIP_PARTS & set(Path(p).parts)]


def module_name(path: Path) -> str | None:
    rel = path.relative_to(ROOT)
    for pkg, folder in sorted(PACKAGES.items(), key=lambda kv: -len(kv[1])):
        if rel.parts[0] == folder:
            parts = [*pkg.split("."), *rel.with_suffix("").parts[1:]]
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return None


def imports_of(tree: ast.Module, name: str, is_pkg: bool, known: set[str]) -> set[str]:
    """Absolute module names this module imports at run time, at any depth, ``if TYPE_CHECKING``
    blocks left out (``from x import y``: x.y when
    that is a module, else x; a package's ``__init__`` is not a dependency of its submodules'
    ``from . import sibling``)."""
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    found: set[str] = set()
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
        for n in ast.walk(block)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:  # annotations only: no import at run time
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = base[: len(base) - node.level + 1]
                mod = ".".join([*up, node.module] if node.module else up)
            else:
                mod = node.module or ""
            subs = {f"{mod}.{a.name}" for a in node.names} & known
            found |= subs if subs else {mod}
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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


def target_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] == ["contractgen", "adapters"] and len(parts) > 2 and parts[2] in TARGETS:
        return parts[2]
    return None


def measure() -> dict:
    lines_by_folder: Counter[str] = Counter()
    sizes: dict[str, int] = {}
    functions: list[tuple[int, str]] = []
    local_imports = fmt_skips = 0
    graph: dict[str, set[str]] = {}
    cross: list[str] = []
    files = tracked_python()
    names = {module_name(p): p for p in files}
    for path in files:
        text = path.read_text()
        rel = str(path.relative_to(ROOT))
        n = text.count("\n")
        sizes[rel] = n
        parts = path.relative_to(ROOT).parts
        folder = "/".join(parts[:2]) if parts[0] == "adapters" and len(parts) > 2 else parts[0]
        lines_by_folder[folder] += n
        fmt_skips += text.count("# fmt: skip")
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.name}"))
                local_imports += sum(
                    isinstance(n, ast.Import | ast.ImportFrom) for n in ast.walk(node)
                )
        name = module_name(path)
        if name is None:
            continue
        is_pkg = path.name == "__init__.py"
        deps = {d for d in imports_of(tree, name, is_pkg, set(names)) if d in names}
        graph[name] = deps - {name}
        own = target_of(name)
        for d in sorted(deps):
            other = target_of(d)
            if own and other and other != own:
                cross.append(f"{name} -> {d}")
    # function-level imports nested in nested functions are counted once per enclosing def
    functions.sort(reverse=True)
    readme = (ROOT / "README.md").read_text().count("\n")
    bench = subprocess.run(
        ["git", "ls-files", "benchmarks"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return {
        "source_lines_total": sum(lines_by_folder.values()),
        "source_lines_by_folder": dict(sorted(lines_by_folder.items())),
        "modules_over_400": sorted(
            (f"{p} {n}" for p, n in sizes.items() if n > 400), key=lambda s: -int(s.split()[-1])
        ),
        "modules_over_500": sum(n > 500 for n in sizes.values()),
        "longest_functions": [f"{f} {n}" for n, f in functions[:8]],
        "functions_over_80": sum(n > 80 for n, _ in functions),
        "function_level_imports": local_imports,
        "fmt_skip": fmt_skips,
        "import_cycles": cycles(graph),
        "cross_target_imports": cross,
        "readme_lines": readme,
        "benchmarks_files": len(bench),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = ap.parse_args()
    m = measure()
    if args.json:
        print(json.dumps(m, indent=1))
        return
    for key, value in m.items():
        if isinstance(value, list | dict) and value:
            print(f"{key}:")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for k, v in items:
                print(f"  {k}: {v}" if isinstance(value, dict) else f"  {v}")
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
