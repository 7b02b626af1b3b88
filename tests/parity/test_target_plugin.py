"""Issue 33: targets are plug-ins. A dummy trainer target, added to a temporary copy of the project
by one folder (its registry entry and templates) and one ``contractgen.toml`` table, goes through
``generate``, ``check``, ``sync``, ``handshake`` and the gate without any file of contractgen
changing; ``--trainers`` names the trainer targets the gate pairs with the rollout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import V1, run_parity_in_process

ROOT = Path(__file__).resolve().parents[2]

# The plug-in: megatron's trainer (its adapter module) under another name, with its own
# templates, rendering the contract's megatron runtime-policy section.
TARGET_PY = """\
from contractgen.codegen.targets import Target

TARGET = Target(
    name="dummy",
    repo="dummy-trainer",
    default_package="dummy_trainer/true_on_policy",
    policy_class="DummyTrueOnPolicyRuntimePolicy",
    contract_class="DummyTrueOnPolicyContract",
    id_constant_is_object=False,
    summary="a test double: the megatron trainer under another name",
    role="trainer",
    adapter="contractgen.adapters.megatron",
    policy_section="megatron",
    off_values=(("attention_backend", "default"), ("cast_qk_norm_input_before_weight_mul", True)),
)
"""
RUNTIME_POLICY_J2 = """\
{% extends "common/runtime_policy.py.j2" %}
{% block docstring %}
\"\"\"Runtime policy of the dummy trainer (a test double of the megatron target).\"\"\"
{% endblock %}
"""
TOML = """
[targets.dummy]
plugin = "targets/dummy/target.py"
init = true
"""


def _cli(*args: str | os.PathLike, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "contractgen", *map(str, args)],
        capture_output=True, text=True, timeout=600, cwd=cwd, env=env,
    )  # fmt: skip


def _git_status() -> str:
    out = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    return out.stdout


def _plugin_project(tmp_path: Path) -> Path:
    """A copy of the project's contracts and config plus the dummy trainer: one folder
    (``targets/dummy/``: its entry and templates) and one ``contractgen.toml`` table."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copytree(ROOT / "contracts", project / "contracts")
    shutil.copy(ROOT / "contractgen.toml", project / "contractgen.toml")
    plugin = project / "targets" / "dummy"
    (plugin / "templates").mkdir(parents=True)
    (plugin / "target.py").write_text(TARGET_PY)
    (plugin / "templates" / "runtime_policy.py.j2").write_text(RUNTIME_POLICY_J2)
    shutil.copy(
        ROOT / "codegen" / "templates" / "megatron" / "__init__.py.j2",
        plugin / "templates" / "__init__.py.j2",
    )
    with (project / "contractgen.toml").open("a") as f:
        f.write(TOML)
    return project


@pytest.mark.slow
def test_dummy_trainer_plugin_through_generate_sync_handshake_and_gate(tmp_path: Path) -> None:
    before = _git_status()
    project = _plugin_project(tmp_path)

    gen = _cli("--root", project, "generate", cwd=tmp_path)
    assert gen.returncode == 0, gen.stderr
    package = project / "generated" / "dummy" / "dummy_trainer" / "true_on_policy"
    policy = (package / "runtime_policy.py").read_text()
    assert "class DummyTrueOnPolicyRuntimePolicy" in policy
    assert "dummy trainer (a test double" in policy
    for built_in in (ROOT / "generated").rglob("*.py"):  # the shipped targets' files unchanged
        rel = built_in.relative_to(ROOT / "generated")
        assert (project / "generated" / rel).read_bytes() == built_in.read_bytes(), rel
    check = _cli("--root", project, "check", cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr

    trainer_repo, rollout_repo = tmp_path / "dummy-trainer", tmp_path / "sglang"
    trainer_repo.mkdir()
    rollout_repo.mkdir()
    sync = _cli(
        "--root", project, "sync", "--repo", f"dummy={trainer_repo}",
        "--repo", f"sglang={rollout_repo}", cwd=tmp_path,
    )  # fmt: skip
    assert sync.returncode == 0, sync.stderr
    written = sorted(p.relative_to(trainer_repo).as_posix() for p in trainer_repo.rglob("*.py"))
    assert written == [f"dummy_trainer/true_on_policy/{n}" for n in
                       ("__init__.py", "contracts.py", "runtime_policy.py", "schema.py")]  # fmt: skip
    assert _cli("--root", project, "check", "--repo", f"dummy-trainer={trainer_repo}",
                cwd=tmp_path).returncode == 0  # fmt: skip
    shake = _cli(
        "--root", project, "handshake", "--rollout", rollout_repo, "--trainer", trainer_repo,
        "--trainer-target", "dummy", "--contract", V1, cwd=tmp_path,
    )  # fmt: skip
    assert shake.returncode == 0, shake.stderr
    assert shake.stdout.startswith(f"handshake ok: {V1} sha256:")

    report = tmp_path / "report.json"
    gate = _cli(
        "--root", project, "parity", "--trainers", "megatron,dummy", "--layouts", "tp1",
        "--rollout-tps", "1", "--no-reference", "--quiet", "--json", report, cwd=tmp_path,
    )  # fmt: skip
    assert gate.returncode == 0, gate.stdout + gate.stderr
    data = json.loads(report.read_text())
    assert data["trainers"] == ["megatron", "dummy"]
    assert [(e["name"], e["target"], e["exact"]) for e in data["layouts"]] == [
        ("tp1", "megatron", True),
        ("dummy/tp1", "dummy", True),
    ]
    assert [(p["name"], p["exact"]) for p in data["pairs"]] == [
        ("rollout tp1 \u00d7 megatron tp1pp1cp1", True),
        ("rollout tp1 \u00d7 dummy tp1pp1cp1", True),
    ]
    assert "trainers  megatron, dummy" in gate.stdout
    assert _git_status() == before  # not one file of contractgen changed


def test_unknown_trainer_exits_2_listing_the_trainer_targets(tmp_path: Path) -> None:
    code, report, out = run_parity_in_process(
        "--trainers", "megatron,deepspeed", "--layouts", "tp1", tmp_path=tmp_path
    )
    assert code == 2
    assert report is None and not any(tmp_path.iterdir())  # nothing written
    lines = [line for line in out.splitlines() if line.strip() and line != "SystemExit(2)"]
    assert lines == [
        "error: --trainers: unknown trainer target 'deepspeed' (known: fsdp, megatron)"
    ]


def test_several_trainers_refuse_train_steps(tmp_path: Path) -> None:
    project = _plugin_project(tmp_path)
    out = tmp_path / "report.json"
    gate = _cli(
        "--root", project, "parity", "--trainers", "megatron,dummy", "--train-steps", "1",
        "--layouts", "tp1", "--json", out, cwd=tmp_path,
    )  # fmt: skip
    assert gate.returncode == 2
    assert gate.stderr.strip() == (
        "error: --train-steps runs one trainer target at a time (got --trainers "
        "megatron,dummy); give --trainers NAME"
    )
    assert not out.exists()


def test_builtin_adapters_expose_their_role_api() -> None:
    from contractgen.codegen.targets import BUILTIN, ROLE_API

    for target in BUILTIN.values():
        module = target.runtime()
        missing = [n for n in ROLE_API[target.role] if not hasattr(module, n)]
        assert not missing, f"{target.adapter} lacks {missing}"
