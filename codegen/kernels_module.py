"""The opt-in vendored kernel module: our Triton invariant linear with SGLang's call signatures.

``render_kernels_module`` writes ``tp_invariant_ops.py`` for a target that sets ``kernels = true``
in ``contractgen.toml``: ``matmul_tp_persistent(A, B, bias=None)`` and
``tree_all_reduce_sum(x, device_group=None)``, the names SGLang's ``sglang.srt.tp_invariant_ops``
exports and its callers (and the Megatron fork's) use, computed by this project's kernels.

The module is **extracted from our kernel source**, not kept as a second copy: the definitions
the template's wrappers call (``ROOTS``) and every top-level definition they reach are cut out of
``adapters/kernels/triton/matmul.py`` (and the helpers it imports from other adapter modules) as
text, by ``ast``, in source order. So the vendored kernel is the one the parity gate runs, and a
change there changes the rendered module (and its stamp: ``contractgen check`` reports the
sibling copy stale). Only torch, triton and the standard library may be imported by what is
extracted; anything else is a ``KernelsModuleError``. Reading the files does not import them:
codegen stays torch-free.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import jinja2

ADAPTERS = Path(__file__).resolve().parent.parent / "adapters"
MODULE_NAME = "tp_invariant_ops.py"
TEMPLATE = "kernels/tp_invariant_ops.py.j2"
# What the template's wrappers call, by the adapter file that defines it.
ROOTS: dict[str, tuple[str, ...]] = {
    "kernels/triton/matmul.py": ("_launch",),
    "kernels/reduce.py": ("pairwise_sum",),
    "tile_order.py": ("first_level_block",),
}
# What the template's own code imports.
TEMPLATE_IMPORTS = ("import math", "import torch", "import torch.distributed as dist")
# The imports extracted code may keep: the module must run with torch and triton alone.
ALLOWED_IMPORTS = ("torch", "triton")
STDLIB = ("functools", "math", "os", "dataclasses", "typing", "collections", "itertools")
# The numerics the wrappers implement (the v1 contract's): every contract a target implements
# must have these kernel-policy values, or the module would compute another contract.
NUMERICS = {
    "matmul_tile_order": "sglang_first_level",
    "matmul_accumulation_dtype": "bfloat16",
    "matmul_k_block": 128,
}


class KernelsModuleError(ValueError):
    """The kernel module cannot be rendered (the message names the definition or contract)."""


@dataclass(frozen=True)
class _Def:
    name: str
    source: str  # the definition's text, its decorators and the comment lines above it
    line: int
    uses: frozenset[str]


def _names_bound(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign):
        targets = [node.target]
    return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _text(lines: list[str], node: ast.stmt) -> str:
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
    while first > 0 and lines[first - 1].lstrip().startswith("#"):  # the comment above it
        first -= 1
    return "".join(lines[first : node.end_lineno])


@dataclass(frozen=True)
class _Source:
    rel: str
    defs: dict[str, _Def]
    imports: dict[str, str]  # bound name -> import statement text (absolute imports)
    relative: dict[str, str]  # bound name -> adapter file it comes from (relative imports)


def _parse(rel: str) -> _Source:
    path = ADAPTERS / rel
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KernelsModuleError(f"{path}: the kernel source is missing") from None
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text, filename=str(path))
    defs: dict[str, _Def] = {}
    imports: dict[str, str] = {}
    relative: dict[str, str] = {}
    here = PurePosixPath(rel).parent
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here
            for _ in range(node.level - 1):
                base = base.parent
            module = (base / (node.module or "").replace(".", "/")).as_posix() + ".py"
            for alias in node.names:
                relative[alias.asname or alias.name] = module.removeprefix("./")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                module = node.module if isinstance(node, ast.ImportFrom) else alias.name
                if isinstance(node, ast.ImportFrom):
                    stmt = f"from {module} import {alias.name}"
                else:
                    stmt = f"import {alias.name}"
                if alias.asname:
                    stmt += f" as {alias.asname}"
                imports[bound] = stmt
        else:
            for name in _names_bound(node):
                uses = frozenset(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
                defs[name] = _Def(name, _text(lines, node), node.lineno, uses)
    return _Source(rel, defs, imports, relative)


def _allowed(stmt: str) -> bool:
    module = stmt.split()[1].split(".")[0]
    return module in ALLOWED_IMPORTS or module in STDLIB


def extract(roots: dict[str, tuple[str, ...]] = ROOTS) -> tuple[list[str], list[str], list[str]]:
    """(import statements, definition texts in source order, adapter files read) of everything
    the ``roots`` reach, following relative imports into other adapter files."""
    sources: dict[str, _Source] = {}
    wanted: dict[str, set[str]] = {}
    queue = [(rel, name) for rel, names in roots.items() for name in names]
    while queue:
        rel, name = queue.pop()
        if rel not in sources:
            sources[rel] = _parse(rel)
        src = sources[rel]
        if name in wanted.setdefault(rel, set()):
            continue
        if name not in src.defs:
            raise KernelsModuleError(
                f"adapters/{rel}: no top-level {name!r}, which the vendored kernel module calls "
                f"(codegen/kernels_module.py ROOTS, codegen/templates/{TEMPLATE})"
            )
        wanted[rel].add(name)
        for used in sorted(src.defs[name].uses):
            if used in src.defs and used != name:
                queue.append((rel, used))
            elif used in src.relative:
                queue.append((src.relative[used], used))
    imports: set[str] = set()
    texts: list[str] = []
    for rel in sorted(sources, key=_file_order):
        src = sources[rel]
        chosen = sorted((src.defs[n] for n in wanted[rel]), key=lambda d: d.line)
        seen: set[str] = set()
        for d in chosen:
            if d.source in seen:  # an assignment binding two names
                continue
            seen.add(d.source)
            texts.append(d.source)
            for used in d.uses:
                if used in src.imports:
                    stmt = src.imports[used]
                    if not _allowed(stmt):
                        raise KernelsModuleError(
                            f"adapters/{rel}: {d.name} needs {stmt!r}; the vendored kernel module "
                            f"may import only {', '.join(ALLOWED_IMPORTS)} and the standard library"
                        )
                    imports.add(stmt)
    return sorted(imports), texts, sorted(f"adapters/{rel}" for rel in sources)


def _file_order(rel: str) -> tuple[int, str]:
    """Helpers first (the files the kernel imports from), the kernel file itself last."""
    return (rel in ROOTS and rel == next(iter(ROOTS)), rel)


def _isort(statements: set[str]) -> list[str]:
    """One ``from`` line per module, stdlib before third party, ``import`` before ``from`` in
    each (ruff's isort order)."""
    plain = {s for s in statements if s.startswith("import ")}
    names: dict[str, list[str]] = {}
    for stmt in statements - plain:
        _, module, _, name = stmt.split(" ", 3)
        names.setdefault(module, []).append(name)
    merged = plain | {f"from {m} import {', '.join(sorted(n))}" for m, n in names.items()}

    def key(stmt: str) -> tuple[bool, bool, str]:
        module = stmt.split()[1]
        return (module.split(".")[0] not in STDLIB, stmt.startswith("from"), module)

    return sorted(merged, key=key)


def check_numerics(kernel_policies: dict[str, dict], where: str) -> None:
    """KernelsModuleError unless every contract (id -> kernel policy) has ``NUMERICS``."""
    for cid, policy in sorted(kernel_policies.items()):
        for field, value in NUMERICS.items():
            if policy.get(field) != value:
                raise KernelsModuleError(
                    f"{where}: the vendored kernel module computes the v1 matmul "
                    f"numerics ({field} = {value!r}); contract {cid!r} has {field} = "
                    f"{policy.get(field)!r}: leave kernels off for this target, or list only "
                    "contracts with those numerics"
                )


def render_kernels_module(
    env: jinja2.Environment, contract_ids: list[str]
) -> tuple[str, list[str]]:
    """(module body, its source files) for a target implementing ``contract_ids``."""
    imports, texts, sources = extract()
    imports = _isort(set(imports) | set(TEMPLATE_IMPORTS))
    stdlib = [s for s in imports if s.split()[1].split(".")[0] in STDLIB]
    third = [s for s in imports if s not in stdlib]
    body = env.get_template(TEMPLATE).render(
        imports="\n".join(stdlib) + "\n\n" + "\n".join(third),
        extracted="\n\n".join(t.rstrip("\n") + "\n" for t in texts),
        k_block=NUMERICS["matmul_k_block"],
        sources=sources,
        contract_ids=contract_ids,
    )
    return body, [*sources, f"codegen/templates/{TEMPLATE}"]
