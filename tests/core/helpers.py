"""Helpers for the core tests: project folders, the CLI in-process and as a process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

from click.testing import CliRunner, Result

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = ROOT / "contracts"
GOLDEN = Path(__file__).resolve().parent / "golden"
V1_ID = "qwen3_dense_true_on_policy_v1"
V2_ID = "qwen3_dense_true_on_policy_v2"
V1_YAML = CONTRACTS / f"{V1_ID}.yaml"
REFRESH = "UPDATE_GOLDENS=1 .venv/bin/python -m pytest tests/core"
UPDATE_GOLDENS = os.environ.get("UPDATE_GOLDENS") == "1"
PACKAGES = {
    "sglang": "python/sglang/srt/true_on_policy",
    "megatron": "miles_megatron_plugins/true_on_policy",
    "launcher": "miles/true_on_policy",
    "fsdp": "miles/backends/fsdp_utils/true_on_policy",
}


def targets_of_repo(repo: str) -> list[str]:
    """The built-in targets vendored into sibling repo ``repo`` (miles: fsdp and launcher), from
    the registry, so a new target changes no count in the tests."""
    from contractgen.codegen.targets import BUILTIN

    return [t.name for t in BUILTIN.values() if t.repo == repo]


def sibling_checkout(repo: Path, *targets: str) -> Path:
    """``repo`` made a checkout that has each target's anchor (the folder its package goes in:
    ``python/sglang/srt`` for sglang), so sync may write there."""
    for target in targets:
        (repo / PACKAGES[target]).parent.mkdir(parents=True, exist_ok=True)
    return repo


def builtin_targets() -> list[str]:
    from contractgen.codegen.targets import BUILTIN

    return list(BUILTIN)


def make_project(
    where: Path,
    contracts: dict[str, str] | None = None,
    config: str = "",
) -> Path:
    """A contractgen project folder: contractgen.toml and contracts/ (default: the shipped ones)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "contractgen.toml").write_text(config)
    folder = where / "contracts"
    folder.mkdir(exist_ok=True)
    if contracts is None:
        for path in sorted(CONTRACTS.glob("*.yaml")):
            shutil.copy(path, folder / path.name)
    else:
        for name, text in contracts.items():
            (folder / name).write_text(text, encoding="utf-8")
    return where


def cli(*args: str | os.PathLike) -> Result:
    """Run the CLI in-process (fast); exceptions other than SystemExit stay on the result."""
    from contractgen.cli import main

    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)


def cli_process(
    *args: str | os.PathLike, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m contractgen`` as a real process (exit codes and stderr as users see them)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "contractgen", *(str(a) for a in args)],
        cwd=cwd or ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def files_under(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` as ``{posix relative path: bytes}`` (caches left out)."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def load_rendered_package(
    files: dict[str, bytes], name: str
) -> tuple[types.ModuleType, types.ModuleType]:
    """Exec rendered ``schema.py`` and ``runtime_policy.py`` as package ``name`` (not in sys.modules
    after return), the way a sibling repo imports them."""
    import importlib.util

    added = []
    try:
        pkg = types.ModuleType(name)
        pkg.__path__ = []  # type: ignore[attr-defined]
        sys.modules[name] = pkg
        added.append(name)
        mods = []
        for stem in ("schema", "runtime_policy"):
            full = f"{name}.{stem}"
            spec = importlib.util.spec_from_loader(full, loader=None)
            mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            mod.__package__ = name
            sys.modules[full] = mod
            added.append(full)
            exec(compile(files[f"{stem}.py"], f"<{full}>", "exec"), mod.__dict__)
            mods.append(mod)
        return mods[0], mods[1]
    finally:
        for key in added:
            sys.modules.pop(key, None)
