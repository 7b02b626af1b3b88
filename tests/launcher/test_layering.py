"""adapters/launcher reads contract data only through the generated modules (load_target, from
the generated-module loader ``contractgen.codegen.vendored``): no import of contractgen.schema
(the pydantic models) or of any other contractgen.codegen module (the renderer, sync), directly
or relatively, in any of its files."""

from __future__ import annotations

import ast
from pathlib import Path

ADAPTER = Path(__file__).resolve().parents[2] / "adapters" / "launcher"
PACKAGE = "contractgen.adapters.launcher"
FORBIDDEN = ("contractgen.schema", "contractgen.codegen")
LOADER = "contractgen.codegen.vendored"  # the one codegen module allowed: it loads generated/


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = PACKAGE.split(".")[: len(PACKAGE.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return names


def test_adapter_imports_no_pydantic_schema_or_codegen() -> None:
    files = sorted(ADAPTER.glob("*.py"))
    assert files
    bad = [
        f"{path.name}: {name}"
        for path in files
        for name in _imports(path)
        if (name.startswith(FORBIDDEN) and not (name == LOADER or name.startswith(LOADER + ".")))
        or name in ("schema", "codegen")
    ]
    assert not bad, bad
