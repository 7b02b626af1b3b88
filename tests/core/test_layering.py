"""Layering is enforced, not hoped for: schema/ and codegen/ never import torch, the CLI's
``check`` path does not either, and adapters never import the pydantic models."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT

HEAVY = ("torch", "numpy", "megatron", "transformers", "safetensors")


def _probe(code: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_schema_and_codegen_modules_do_not_import_torch() -> None:
    code = f"""
import importlib, json, pkgutil, sys
import contractgen.schema, contractgen.codegen
names = []
for pkg in (contractgen.schema, contractgen.codegen):
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(info.name)
        names.append(info.name)
print(json.dumps({{"modules": names, "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""
    report = _probe(code)
    assert "contractgen.schema.loader" in report["modules"]
    assert "contractgen.codegen.render" in report["modules"]
    assert report["heavy"] == []


@pytest.mark.parametrize("verb", ["check", "list", "generate --help", "sync --help", "schema"])
def test_cli_light_verbs_do_not_import_torch(verb: str) -> None:
    code = f"""
import json, runpy, sys, io, contextlib
sys.argv = ["contractgen", "--root", {str(ROOT)!r}, *{verb.split()!r}]
out = io.StringIO()
try:
    with contextlib.redirect_stdout(out):
        runpy.run_module("contractgen", run_name="__main__")
except SystemExit as exc:
    code = exc.code
print(json.dumps({{"code": code, "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""
    report = _probe(code)
    assert report["code"] in (0, None)
    assert report["heavy"] == []


def _source_files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _imports(path: Path, package: str) -> list[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.append(module)
            names += [f"{module}.{a.name}" for a in node.names]
    return names


def _package_of(path: Path, folder: str, dotted: str) -> str:
    rel = path.relative_to(ROOT / folder).with_suffix("")
    parts = [dotted, *rel.parts]
    return ".".join(parts if path.name == "__init__.py" else parts[:-1]).removesuffix(".__init__")


def test_adapters_never_import_the_pydantic_models() -> None:
    """Adapters read the generated policy (contractgen.codegen.vendored), never contractgen.schema."""
    files = _source_files("adapters")
    assert files
    offenders = []
    for path in files:
        package = _package_of(path, "adapters", "contractgen.adapters")
        for name in _imports(path, package):
            if (
                name == "contractgen.schema"
                or name.startswith("contractgen.schema.")
                or name == "pydantic"
            ):
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []


@pytest.mark.parametrize("folder", ["schema", "codegen"])
def test_no_torch_import_anywhere_in_schema_or_codegen(folder: str) -> None:
    """Not even lazily inside a function."""
    dotted = f"contractgen.{folder}"
    offenders = [
        f"{p.relative_to(ROOT)}: {name}"
        for p in _source_files(folder)
        for name in _imports(p, _package_of(p, folder, dotted))
        if name.split(".")[0] in HEAVY
        or (name.startswith("contractgen.adapters") and not _is_families(name))
    ]
    assert offenders == []


# The adapters that schema/ may import: standard library only (checked below).
STDLIB_ADAPTERS = (
    "contractgen.adapters.families",
    "contractgen.adapters.tile_order",
    "contractgen.adapters.common.layout",
)


def _is_families(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in STDLIB_ADAPTERS)


def test_families_are_stdlib_only() -> None:
    """schema/ rules import the family descriptions, so they import nothing heavy and no other
    adapter (``contractgen.adapters/__init__`` is a docstring)."""
    files = [*_source_files("adapters/families"), ROOT / "adapters/tile_order.py",
             ROOT / "adapters/common/layout.py"]  # fmt: skip
    assert {p.name for p in files} >= {"__init__.py", "qwen3_dense.py", "llama3_dense.py"}
    offenders = [
        f"{p.relative_to(ROOT)}: {name}"
        for p in files
        for name in _imports(p, _package_of(p, "adapters", "contractgen.adapters"))
        if name.split(".")[0] in HEAVY
        or (name.startswith("contractgen.") and not _is_families(name))
        or name == "pydantic"
    ]
    assert offenders == []
    assert (ROOT / "adapters" / "__init__.py").read_text().strip() == '"""contractgen.adapters"""'


def test_the_scan_resolves_relative_imports(tmp_path: Path) -> None:
    """Guard the guard: ``from ...schema import models`` in adapters/x/y.py is caught."""
    probe = tmp_path / "y.py"
    probe.write_text("from ...schema import models\nfrom ..vendored import load_target\n")
    names = _imports(probe, "contractgen.adapters.x")
    assert "contractgen.schema" in names
    assert "contractgen.vendored" not in names  # ..vendored from adapters.x is adapters.vendored


def test_adapters_never_import_the_cli_package() -> None:
    """The dependency points one way: the CLI (``contractgen/``: commands, the parity gate)
    imports the adapters; adapters import only adapters and ``codegen`` (the generated-module
    loader), so a sibling repo can use them without the command line."""
    allowed = ("contractgen.adapters", "contractgen.codegen")
    offenders = [
        f"{p.relative_to(ROOT)}: {name}"
        for p in _source_files("adapters")
        for name in _imports(p, _package_of(p, "adapters", "contractgen.adapters"))
        if name.startswith("contractgen")
        and not any(name == a or name.startswith(a + ".") for a in allowed)
    ]
    assert offenders == []
