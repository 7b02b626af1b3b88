"""The public API of a module as text, read statically (``ast``): each module-level public name with
a comparable description (a signature, a class with its fields and public methods, a value, a
re-export). ``adopt`` compares these of the hand-kept and the generated file, name by name."""

from __future__ import annotations

import ast


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return f"def {node.name}({ast.unparse(node.args)})"


def _describe(node: ast.stmt, package: str = "") -> dict[str, str]:
    """Public names a statement defines at module level, each with a comparable description."""
    out: dict[str, str] = {}
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        out[node.name] = _signature(node)
    elif isinstance(node, ast.ClassDef):
        members = []
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                default = f" = {ast.unparse(item.value)}" if item.value is not None else ""
                members.append(f"{item.target.id}: {ast.unparse(item.annotation)}{default}")
            elif isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                if not item.name.startswith("_") or item.name == "__init__":
                    members.append(_signature(item))
        bases = ", ".join(ast.unparse(b) for b in node.bases)
        out[node.name] = f"class {node.name}({bases}): " + "; ".join(members)
    elif isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Name):
                out[target.id] = ast.unparse(node.value)
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        out[node.target.id] = ast.unparse(node.value) if node.value is not None else ""
    elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
        module = "." * node.level + (node.module or "")
        if package and (node.module or "").startswith(package):
            module = "." + (node.module or "")[len(package) :].lstrip(".")  # the package's own
        for alias in node.names:  # kept here; only re-exports stay public (public_names)
            name = alias.asname or alias.name
            if name != "*":
                out[name] = f"from {module} import {alias.name}"
    elif isinstance(node, ast.If):  # e.g. `if TYPE_CHECKING:` blocks
        for child in node.body:
            out.update(_describe(child, package))
    return {k: v for k, v in out.items() if not k.startswith("_")}


def public_names(source: bytes, package: str = "") -> dict[str, str]:
    """``{public name: description}`` of a module's top level (SyntaxError if it does not parse).

    An import is public API when re-exported: listed in ``__all__``, or taken from the package's
    own modules (``from .schema import ModelFamily``; or absolutely, as SGLang's modules import
    ``sglang.srt.true_on_policy.schema``), which sibling modules import from here.
    """
    tree = ast.parse(source)
    names: dict[str, str] = {}
    for node in tree.body:
        names.update(_describe(node, package))
    exported = _dunder_all(tree) or set()
    return {
        k: v
        for k, v in names.items()
        if not v.startswith("from ") or k in exported or v.startswith("from .")
    }


def _dunder_all(tree: ast.Module) -> set[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            try:
                return set(ast.literal_eval(node.value))
            except ValueError:
                return None
    return None
