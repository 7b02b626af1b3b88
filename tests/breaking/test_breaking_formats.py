"""``--format text|json|github`` pinned by golden files, ``--against`` a directory, and the
usage errors (exit 2). Goldens live in formats/; UPDATE_GOLDENS=1 refreshes them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from breaking_support import (
    FIXTURE,
    HERE,
    V1,
    V2,
    check_golden,
    cli,
    commit,
    copy_fixture,
    generate,
    git,
    make_repo,
    replace,
    transcript,
)

from contractgen.codegen.breaking import ABSENT, Finding, format_github

FORMATS = HERE / "formats"


def mixed_change(root: Path) -> None:
    """Two breaking changes in v1 and fine ones (a description, a new contract and its names)."""
    replace(root, V1, "  logsoftmax_dtype: bfloat16", "  logsoftmax_dtype: float32")
    replace(
        root,
        V1,
        "    - {name: Qwen3-32B, hidden_size: 5120, intermediate_size: 25600, num_layers: 64,\n"
        "       num_attention_heads: 64, num_kv_heads: 8, head_dim: 128, vocab_size: 151936,\n"
        "       tie_word_embeddings: false, max_position_embeddings: 40960}\n",
        "",
    )
    replace(root, V2, "so RL skips the prefill", "so RL can skip the prefill")
    code, _, err = cli(root, "new", "--from", "qwen3_dense_true_on_policy_v2")
    assert code == 0, err


@pytest.fixture
def mixed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_repo(tmp_path / "project")
    monkeypatch.chdir(tmp_path)
    mixed_change(root)
    generate(root)
    commit(root, "mixed")
    return root


@pytest.mark.parametrize(
    ("golden", "args"),
    [
        ("text.txt", []),
        ("text-verbose.txt", ["-v"]),
        ("json.txt", ["--format", "json"]),
        ("github.txt", ["--format", "github"]),
        ("github-verbose.txt", ["--format", "github", "-v"]),
    ],
)
def test_format_golden(mixed: Path, golden: str, args: list[str]) -> None:
    check_golden(FORMATS / golden, transcript(mixed, ["breaking", "--against", "HEAD~1", *args]))


def test_json_is_a_report(mixed: Path) -> None:
    code, out, _ = cli(mixed, "breaking", "--against", "main~1", "--format", "json")
    report = json.loads(out)
    assert code == 1 and report["ok"] is False and report["against"] == "main~1"
    assert [f["rule"] for f in report["breaking"]] == [
        "CHECKPOINT_REMOVED",
        "KERNEL_POLICY_CHANGED",
    ]
    assert {f["rule"] for f in report["info"]} >= {"CONTRACT_ADDED", "DESCRIPTION_CHANGED"}
    kernel = report["breaking"][1]
    assert (kernel["old"], kernel["new"], kernel["line"]) == ("bfloat16", "float32", 90)


def test_github_paths_are_relative_to_the_repository(tmp_path: Path) -> None:
    """A project in a subfolder of its git repo: annotations name repo-relative paths."""
    root = tmp_path / "repo" / "sub"
    root.parent.mkdir()
    copy_fixture(root)
    git(root.parent, "-c", "init.defaultBranch=main", "init", "-q")
    commit(root.parent, "base")
    replace(root, V1, "  logsoftmax_dtype: bfloat16", "  logsoftmax_dtype: float32")
    code, out, _ = cli(root, "breaking", "--against", "main", "--format", "github")
    assert code == 1
    assert out.startswith(
        "::error file=sub/contracts/qwen3_dense_true_on_policy_v1.yaml,line=93,col=3,"
        "title=KERNEL_POLICY_CHANGED (qwen3_dense_true_on_policy_v1)::"
        'kernel_policy.logsoftmax_dtype: "bfloat16" → "float32". '
    )


def test_github_escapes_annotation_syntax() -> None:
    finding = Finding("PUBLIC_NAME_REMOVED", "a,b:c%.py", "X", None, "X", ABSENT, fix="1%\n2")
    out, _ = format_github([finding], "main")
    assert out == ("::error file=a%2Cb%3Ac%25.py,title=PUBLIC_NAME_REMOVED::X: removed. 1%25%0A2\n")


def test_uncommitted_changes_are_compared_with_the_ref(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "project")
    replace(root, V1, "attention_kv_chunk: 64", "attention_kv_chunk: 32")
    code, out, _ = cli(root, "breaking", "--against", "HEAD")
    assert code == 1
    assert "kernel_policy.attention_kv_chunk: 64 → 32 [KERNEL_POLICY_CHANGED]" in out


# ---------------------------------------------------------------------------------------------
# --against a directory


def test_against_a_directory_matches_against_a_ref(
    mixed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fixture as a contracts folder and as a project root give the git ref's findings."""
    old = tmp_path / "old"
    shutil.copytree(FIXTURE, old)
    monkeypatch.chdir(tmp_path)
    ref = cli(mixed, "breaking", "--against", "HEAD~1", "-v", "--format", "json")
    for against in ("old/contracts", "old", str(old / "contracts")):
        got = cli(mixed, "breaking", "--against", against, "-v", "--format", "json")
        assert got[0] == ref[0] == 1
        report, expected = json.loads(got[1]), json.loads(ref[1])
        assert report["against"] == against
        assert report["breaking"] == expected["breaking"]
        assert report["info"] == expected["info"]


def test_against_a_directory_without_git(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path / "project")
    old = shutil.copytree(FIXTURE / "contracts", tmp_path / "released")
    (root / V2).unlink()
    code, out, _ = cli(root, "breaking", "--against", str(old))
    assert code == 1
    assert (
        out.splitlines()[0]
        == "contracts/qwen3_dense_true_on_policy_v2.yaml: id: removed [CONTRACT_REMOVED]"
    )


# ---------------------------------------------------------------------------------------------
# exit 2: usage and invalid input


def test_unknown_ref(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_repo(tmp_path / "project")
    monkeypatch.chdir(tmp_path)
    check_golden(FORMATS / "unknown-ref.txt", transcript(root, ["breaking", "--against", "v9.9"]))


def test_not_a_git_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_fixture(tmp_path / "project")
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(root, "breaking", "--against", "main")
    assert code == 2
    assert err.startswith("error: --against 'main': not a directory, and ")
    assert "is not in a git repository" in err


def test_option_like_ref_is_refused(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "project")
    code, _, err = cli(root, "breaking", "--against=--all")
    assert code == 2 and "not a git ref" in err


def test_missing_against_is_usage(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "project")
    code, _, err = cli(root, "breaking")
    assert code == 2 and "--against" in err


def test_invalid_contract_at_the_ref(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Problems at the ref name the ref: ``HEAD~1:contracts/…:line:col: field: message``."""
    root = make_repo(tmp_path / "project")
    monkeypatch.chdir(tmp_path)
    replace(root, V1, "  matmul_k_block: 128", "  matmul_k_block: 0")
    commit(root, "broken")
    replace(root, V1, "  matmul_k_block: 0", "  matmul_k_block: 128")
    commit(root, "fixed")
    check_golden(
        FORMATS / "invalid-at-ref.txt", transcript(root, ["breaking", "--against", "HEAD~1"])
    )


def test_invalid_contract_now(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "project")
    replace(root, V1, "  matmul_k_block: 128", "  matmul_k_block: 0")
    code, out, err = cli(root, "breaking", "--against", "HEAD")
    assert code == 2 and out == ""
    assert err.startswith("contracts/qwen3_dense_true_on_policy_v1.yaml:82:")


def test_ref_without_contracts_is_an_empty_baseline(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    git(root, "-c", "init.defaultBranch=main", "init", "-q")
    commit(root, "empty")
    shutil.copytree(FIXTURE, root, dirs_exist_ok=True)
    code, out, err = cli(root, "breaking", "--against", "main", "-v")
    assert code == 0, out + err
    assert out.count("[CONTRACT_ADDED]") == 2
    assert err == "breaking: ok against main (2 non-breaking change(s))\n"


def test_output_is_the_same_under_any_hash_seed(mixed: Path) -> None:
    """Findings are sorted, never in set or hash order."""
    outputs = set()
    for seed in ("0", "1"):
        proc = subprocess.run(
            [sys.executable, "-m", "contractgen", "--root", str(mixed), "breaking",
             "--against", "HEAD~1", "-v", "--format", "json"],
            capture_output=True, env={**os.environ, "PYTHONHASHSEED": seed}, check=False,
        )  # fmt: skip
        assert proc.returncode == 1, proc.stderr
        outputs.add(proc.stdout)
    assert len(outputs) == 1
