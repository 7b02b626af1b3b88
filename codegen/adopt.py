"""``adopt``: what replacing a hand-kept vendored package with the generated one changes.

A semantic diff of public names, not of text: each module-level public name of a file that sync
would overwrite (assignments, functions with their signatures, classes with their fields and
methods) is compared with the same name in the generated file. A public name the generated file
drops is refused unless the generated package still provides it in another module (a contract
provides it) or the user allows the drop by name.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from .config import ProjectConfig
from .drift import target_files
from .fingerprint import split_generated


@dataclass(frozen=True)
class NameChange:
    target: str
    file: str  # path inside the sibling repo
    name: str
    kind: str  # "added" | "changed" | "dropped"
    old: str = ""
    new: str = ""
    provided_by: str = ""  # for a drop: the generated module that still defines it


@dataclass
class AdoptPlan:
    changes: list[NameChange] = field(default_factory=list)

    def refused(self, allowed: set[str]) -> list[NameChange]:
        return [
            c
            for c in self.changes
            if c.kind == "dropped" and not c.provided_by and c.name not in allowed
        ]


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    args = node.args
    return f"def {node.name}({ast.unparse(args)})"


def _describe(node: ast.stmt) -> dict[str, str]:
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
        for alias in node.names:  # kept here; only re-exports stay public (public_names)
            name = alias.asname or alias.name
            if name != "*":
                out[name] = f"from {'.' * node.level}{node.module or ''} import {alias.name}"
    elif isinstance(node, ast.If):  # e.g. `if TYPE_CHECKING:` blocks
        for child in node.body:
            out.update(_describe(child))
    return {k: v for k, v in out.items() if not k.startswith("_")}


def public_names(source: bytes) -> dict[str, str]:
    """``{public name: description}`` of a module's top level (SyntaxError if it does not parse)."""
    tree = ast.parse(source)
    names: dict[str, str] = {}
    for node in tree.body:
        names.update(_describe(node))
    exported = _dunder_all(tree) or set()
    # An import is public API when re-exported: listed in __all__, or taken from the package's
    # own modules (``from .schema import ModelFamily``, which sibling modules import from here).
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


def _comparable(description: str) -> str:
    """Descriptions of an import and of a definition of the same object count as the same."""
    return "import" if description.startswith("from ") else description


def plan_adopt(
    rendered: dict[str, bytes], target: str, repo: Path, config: ProjectConfig
) -> AdoptPlan:
    """Name-by-name changes of every hand-kept file that syncing ``target`` into ``repo`` replaces."""
    files = target_files(rendered, target, config)
    generated = {rel: public_names(content) for rel, content in files.items()}
    plan = AdoptPlan()
    for rel in sorted(files):
        dest = repo / rel
        if not dest.is_file():
            continue
        current = dest.read_bytes()
        if split_generated(current) is not None:
            continue  # already contractgen's: sync's own checks apply
        try:
            old = public_names(current)
        except SyntaxError as exc:
            raise ValueError(f"{dest}: does not parse ({exc.msg}, line {exc.lineno})") from None
        new = generated[rel]
        for name in sorted(set(old) | set(new)):
            if name not in old:
                plan.changes.append(NameChange(target, rel, name, "added", new=new[name]))
            elif name not in new:
                elsewhere = sorted(r for r, names in generated.items() if name in names)
                plan.changes.append(
                    NameChange(
                        target,
                        rel,
                        name,
                        "dropped",
                        old=old[name],
                        provided_by=elsewhere[0] if elsewhere else "",
                    )  # fmt: skip
                )
            elif _comparable(old[name]) != _comparable(new[name]):
                plan.changes.append(
                    NameChange(target, rel, name, "changed", old=old[name], new=new[name])
                )
    return plan
