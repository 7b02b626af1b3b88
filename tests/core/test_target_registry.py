"""The target registry (issue 33): several targets per role, looked up by name and role, and a
project's plug-in targets (``[targets.NAME] plugin = "file.py"``), with errors that name the
place and the fix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from contractgen.codegen.config import ConfigError, load_config
from contractgen.codegen.targets import (
    BUILTIN,
    UnknownTargetError,
    by_role,
    get_target,
    targets_for_role,
)

from .helpers import CONTRACTS, ROOT

PLUGIN = """\
from contractgen.codegen.targets import Target

TARGET = Target(
    name="{name}", repo="dummy-trainer", default_package="dummy/true_on_policy",
    policy_class="DummyRuntimePolicy", contract_class="DummyContract",
    id_constant_is_object=False, summary="test double", role="trainer",
    adapter="contractgen.adapters.megatron", policy_section="megatron",
)
"""


def _project(tmp_path: Path, name: str = "dummy", table: str = "dummy") -> Path:
    shutil.copytree(CONTRACTS, tmp_path / "contracts")
    plugin = tmp_path / "targets" / "dummy"
    shutil.copytree(ROOT / "codegen" / "templates" / "megatron", plugin / "templates")
    (plugin / "target.py").write_text(PLUGIN.format(name=name))
    (tmp_path / "contractgen.toml").write_text(
        f'[targets.{table}]\nplugin = "targets/dummy/target.py"\n'
    )
    return tmp_path


def test_lookup_by_name_and_role_lists_the_valid_ones() -> None:
    assert [t.name for t in targets_for_role("trainer", load_config(ROOT))] == ["megatron", "fsdp"]
    assert by_role("rollout").name == "sglang"
    with pytest.raises(UnknownTargetError) as exc:
        get_target("deepspeed")
    assert str(exc.value) == "unknown target 'deepspeed' (known: fsdp, launcher, megatron, sglang)"
    with pytest.raises(UnknownTargetError) as exc:
        by_role("trainer", "sglang")
    assert str(exc.value) == "unknown trainer target 'sglang' (known: fsdp, megatron)"


def test_a_plugin_joins_the_registry_and_renders_beside_the_built_ins(tmp_path: Path) -> None:
    from contractgen.codegen.render import render
    from contractgen.schema.loader import load_contracts

    config = load_config(_project(tmp_path))
    assert list(config.targets) == [*BUILTIN, "dummy"]
    assert [t.name for t in targets_for_role("trainer", config)] == ["megatron", "fsdp", "dummy"]
    files = render(load_contracts(config.contracts_dir, config.root), config)
    policy = files["dummy/dummy/true_on_policy/runtime_policy.py"].decode()
    assert "class DummyRuntimePolicy" in policy
    for path, content in files.items():  # the built-in targets render as they always did
        if not path.startswith("dummy/"):
            assert (ROOT / "generated" / path).read_bytes() == content, path


@pytest.mark.parametrize(
    ("name", "table", "plugin", "message"),
    [
        ("dummy", "dummy", "targets/none.py", "does not exist (a Python file defining TARGET)"),
        ("other", "dummy", None, "must define TARGET = Target(name='dummy', …)"),
        ("megatron", "megatron", None, "'megatron' is a built-in target; give the plugin"),
        ("dummy", "dummy", "../x.py", "must be a relative path inside the repo"),
    ],
)
def test_plugin_errors_name_the_place_and_the_fix(
    tmp_path: Path, name: str, table: str, plugin: str | None, message: str
) -> None:
    root = _project(tmp_path, name, table)
    if plugin is not None:
        (root / "contractgen.toml").write_text(f'[targets.{table}]\nplugin = "{plugin}"\n')
    with pytest.raises(ConfigError) as exc:
        load_config(root)
    text = str(exc.value)
    assert text.startswith(f"contractgen.toml:2:1: targets.{table}.plugin: "), text
    assert message in text, text


def test_an_unknown_target_table_says_how_to_add_one(tmp_path: Path) -> None:
    (tmp_path / "contractgen.toml").write_text('[targets.deepspeed]\npackage = "x/y"\n')
    with pytest.raises(ConfigError) as exc:
        load_config(tmp_path)
    assert str(exc.value) == (
        "contractgen.toml:1:1: targets.deepspeed: unknown target (known: fsdp, launcher, megatron, "
        "sglang); "
        'a new target is a Python file defining TARGET, named by plugin = "path/to/target.py"'
    )
