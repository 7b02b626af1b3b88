"""Baseline of the command line: the flags of list/schema/generate/check/sync and the exit codes
(0 ok, 1 drift / mismatch, 2 invalid input or usage)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .helpers import ROOT, V1_YAML, builtin_targets, cli, cli_process, make_project

FLAGS = {
    "list": ["--json", "--help"],
    "schema": ["--help"],
    "generate": ["--help"],
    "check": ["--repo NAME=PATH", "--json", "--help"],
    "sync": ["--repo NAME=PATH", "--dry-run", "--force", "--help"],
    "add-checkpoint": ["--name TEXT", "--tp-sizes", "--dry-run", "--help"],
}
GLOBAL_FLAGS = ["--version", "--root DIRECTORY", "--contracts DIRECTORY", "--help"]


def _options(help_text: str) -> list[str]:
    """Option names (with metavar) listed under 'Options:' in click's help."""
    section = help_text.split("Options:", 1)[1]
    found = []
    for line in section.splitlines():
        m = re.match(r"^  (?:-\w, )?(--[\w-]+(?: [A-Z=_]+)?)", line)
        if m:
            found.append(m.group(1).strip())
    return found


@pytest.mark.parametrize("verb", sorted(FLAGS))
def test_verb_flags_are_frozen(verb: str) -> None:
    result = cli(verb, "--help")
    assert result.exit_code == 0
    assert _options(result.output) == FLAGS[verb], result.output


def test_global_flags_and_verbs() -> None:
    result = cli("--help")
    assert result.exit_code == 0
    assert _options(result.output) == GLOBAL_FLAGS
    assert (
        "Exit codes: 0 ok, 1 drift / mismatch / parity failure, 2 invalid input or" in result.output
    )
    commands = result.output.split("Commands:", 1)[1]
    for verb in FLAGS:
        assert re.search(rf"^  {verb}\s", commands, re.M), verb
    assert cli("-h").output == result.output


def test_sync_repo_is_required() -> None:
    result = cli("sync")
    assert result.exit_code == 2
    assert "Missing option '--repo'" in result.stderr


def test_version() -> None:
    from contractgen import __version__

    result = cli("--version")
    assert result.exit_code == 0
    assert result.output == f"contractgen, version {__version__}\n"


# --------------------------------------------------------------------------------------------
# exit codes


def test_exit_0_ok() -> None:
    for args in (["list"], ["schema"], ["check"], ["check", "--json"], ["list", "--json"]):
        result = cli("--root", ROOT, *args)
        assert result.exit_code == 0, (args, result.output, result.stderr)


def test_exit_1_drift(project: Path) -> None:
    from contractgen.project import open_project

    result = cli("--root", project, "check")  # generated/ not written yet
    assert result.exit_code == 1
    rendered = open_project(project).rendered  # every file of every target
    assert {k.split("/", 1)[0] for k in rendered} == set(builtin_targets())
    assert result.output.count("missing: generated/") == len(rendered)


@pytest.mark.parametrize(
    "args",
    [
        ["no-such-verb"],
        ["check", "--no-such-flag"],
        ["check", "--repo", "sglang"],  # not NAME=PATH
        ["check", "--repo", "vllm=/tmp"],  # unknown repo name
        ["check", "--repo", "sglang=/tmp", "--repo", "sglang=/tmp"],  # twice
        ["sync", "--repo", "sglang=/definitely/not/here"],
        ["--root", "/definitely/not/here", "check"],
    ],
)
def test_exit_2_usage(args: list[str]) -> None:
    result = cli(*args)
    assert result.exit_code == 2, (result.output, result.stderr)
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_exit_2_unknown_repo_lists_names() -> None:
    from contractgen.codegen.targets import BUILTIN

    result = cli("check", "--repo", "vllm=/tmp")
    known = ", ".join(f"{t.name} (repo {t.repo})" for t in BUILTIN.values())
    assert f"unknown repo name 'vllm'; use one of: {known}" in result.stderr
    assert "megatron (repo Megatron-LM)" in known and "launcher (repo miles)" in known


def test_exit_2_invalid_contract_for_every_verb(tmp_path: Path) -> None:
    bad = V1_YAML.read_text().replace(
        "num_kv_heads: 8, head_dim: 128", "num_kv_heads: 5, head_dim: 128", 1
    )
    project = make_project(tmp_path / "p", {V1_YAML.name: bad})
    for verb in (["list"], ["generate"], ["check"], ["sync", "--repo", f"sglang={tmp_path}"]):
        result = cli("--root", project, *verb)
        assert result.exit_code == 2, verb
        assert result.stderr.startswith(
            "contracts/qwen3_dense_true_on_policy_v1.yaml:35:33: "
            "model_profile.checkpoints.0.num_kv_heads: must divide num_attention_heads (got 5 for 16)"
        ), result.stderr
    assert not (project / "generated").exists()


def test_exit_2_bad_config(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p", config="[targets.vllm]\npackage = 'x'\n")
    result = cli("--root", project, "check")
    assert result.exit_code == 2
    known = ", ".join(sorted(builtin_targets()))
    assert f"targets.vllm: unknown target (known: {known})" in result.stderr
    broken = make_project(tmp_path / "q", config="contracts = [")
    assert cli("--root", broken, "check").exit_code == 2


def test_exit_2_file_name_must_match_id(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p", {"other_v1.yaml": V1_YAML.read_text()})
    result = cli("--root", project, "check")
    assert result.exit_code == 2
    assert result.stderr == (
        "contracts/other_v1.yaml:1:1: id: file name must be the contract id "
        "(expected qwen3_dense_true_on_policy_v1.yaml)\n"
    )


def test_exit_codes_as_a_real_process(project: Path) -> None:
    """python -m contractgen: the same codes outside click's test runner."""
    assert cli_process("--root", ROOT, "check").returncode == 0
    drift = cli_process("--root", project, "check")
    assert drift.returncode == 1
    usage = cli_process("check", "--repo", "nope")
    assert usage.returncode == 2
    assert "Traceback" not in usage.stderr
