"""Where the built-in project lives: the contracts and generated files shipped with contractgen."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

from .config import CONFIG_NAME, ProjectConfig, load_config


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


# What contractgen.toml declares for each target (a wheel ships no contractgen.toml; a test keeps
# the two equal): the contracts the public repos implement today.
BUILTIN_DECLARED: dict[str, tuple[str, ...]] = {
    "fsdp": ("qwen3_dense_true_on_policy_v1",),
    "launcher": ("qwen3_dense_true_on_policy_v1",),
    "megatron": ("qwen3_dense_true_on_policy_v1",),
    "sglang": ("qwen3_dense_true_on_policy_v1",),
}


@cache
def builtin_config() -> ProjectConfig:
    """The project config of contractgen's own checkout (editable install) or of its package data."""
    source_root = Path(__file__).resolve().parent.parent
    if (source_root / CONFIG_NAME).is_file():
        return load_config(source_root)
    contracts = _package_dir("contractgen.contracts")
    generated = _package_dir("contractgen.generated")
    config = load_config(source_root)
    return ProjectConfig(
        root=contracts.parent if contracts else source_root,
        contracts_dir=contracts or config.contracts_dir,
        generated_dir=generated or config.generated_dir,
        packages=config.packages,
        no_init=config.no_init,
        declared=dict(BUILTIN_DECLARED),
        formats=config.formats,
    )
