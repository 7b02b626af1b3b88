"""Issue 12: hostile input exits 2 with ``file:line:col: field: message``, writes nothing, and
never shows a traceback. Each test pins one finding of the issue."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from .helpers import V1_ID, V1_YAML, cli, files_under, make_project, sibling_checkout

V2_ID = "qwen3_dense_true_on_policy_v2"
PROBLEM = re.compile(r"^[^:\n]+:\d+:\d+: .+$")


def _project_with(tmp_path: Path, old: str, new: str, config: str = "") -> Path:
    root = make_project(tmp_path / "p", config=config)
    path = root / "contracts" / f"{V1_ID}.yaml"
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))
    return root


def _assert_refused(root: Path, *args: str, where: str = "", field: str = "") -> str:
    before = files_under(root)
    result = cli("--root", root, *(args or ("generate",)))
    assert result.exit_code == 2, (result.output, result.stderr, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output + result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines and all(PROBLEM.match(line) for line in lines), result.stderr
    if where:
        assert any(line.startswith(where) for line in lines), result.stderr
    if field:
        assert any(f": {field}: " in line for line in lines), result.stderr
    assert files_under(root) == before, "an invalid project must write nothing"
    return result.stderr


# --- sizes: bounded, and the tile-order proof iterates ---------------------------------------


def test_long_tile_chain_does_not_recurse(tmp_path: Path) -> None:
    # 256256 = 2002 tiles of 128: the TP=1 tree is a left fold 1001 deep (RecursionError before)
    root = _project_with(tmp_path, "intermediate_size: 3072", "intermediate_size: 256256")
    err = _assert_refused(root, field="model_profile.checkpoints.0.intermediate_size")
    assert "TP=4" in err and "RecursionError" not in err


def test_huge_tile_count_is_refused_not_built(tmp_path: Path) -> None:
    root = _project_with(
        tmp_path,
        "matmul_k_block: 128",
        "matmul_k_block: 1",
    )
    path = root / "contracts" / f"{V1_ID}.yaml"
    path.write_text(
        path.read_text().replace("intermediate_size: 3072", "intermediate_size: 16777216")
    )
    err = _assert_refused(root, field="model_profile.checkpoints.0.intermediate_size")
    assert "more than 65536 tiles" in err


@pytest.mark.parametrize("value", ["1000000000000000", "1" + "0" * 60])
def test_sizes_are_bounded(tmp_path: Path, value: str) -> None:
    root = _project_with(tmp_path, "vocab_size: 151936", f"vocab_size: {value}")
    err = _assert_refused(
        root, where=f"contracts/{V1_ID}.yaml:35:", field="model_profile.checkpoints.0.vocab_size"
    )
    assert "less than or equal to 16777216" in err


# --- values YAML reads in surprising ways ------------------------------------------------------


def test_yaml11_exponent_gets_a_hint(tmp_path: Path) -> None:
    root = _project_with(tmp_path, "theta: 1000000.0", "theta: 1e6")
    err = _assert_refused(
        root, where=f"contracts/{V1_ID}.yaml:32:", field="model_profile.rope.theta"
    )
    assert "YAML 1.1" in err and "write 1.0e+6" in err


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_non_finite_floats_point_at_the_field(tmp_path: Path, value: str) -> None:
    root = _project_with(tmp_path, "theta: 1000000.0", f"theta: {value}")
    err = _assert_refused(
        root, where=f"contracts/{V1_ID}.yaml:32:30:", field="model_profile.rope.theta"
    )
    assert "finite" in err


# --- supersedes ------------------------------------------------------------------------------


def test_contract_superseding_itself_is_refused_at_its_line(tmp_path: Path) -> None:
    root = _project_with(tmp_path, "supersedes: null", f"supersedes: {V1_ID}")
    err = _assert_refused(root, "list", where=f"contracts/{V1_ID}.yaml:14:1:", field="supersedes")
    assert "cannot supersede itself" in err


def test_two_contract_supersedes_cycle_is_refused(tmp_path: Path) -> None:
    root = _project_with(tmp_path, "supersedes: null", f"supersedes: {V2_ID}")
    err = _assert_refused(root, "list", field="supersedes")
    assert f"contracts/{V1_ID}.yaml:14:1:" in err and f"contracts/{V2_ID}.yaml:13:1:" in err
    assert "cycle" in err
    result = cli("--root", root, "breaking", "--against", root / "contracts")
    assert result.exit_code == 2, result.output


def test_unknown_supersedes_points_at_its_line(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    path = root / "contracts" / f"{V2_ID}.yaml"
    path.write_text(path.read_text().replace(f"supersedes: {V1_ID}", "supersedes: nope_v1"))
    _assert_refused(root, "list", where=f"contracts/{V2_ID}.yaml:13:1:", field="supersedes")


# --- the contracts folder ------------------------------------------------------------------


def test_fifo_named_yaml_does_not_hang(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    os.mkfifo(root / "contracts" / "x.yaml")
    err = _assert_refused(root, where="contracts/x.yaml:1:1:")
    assert "not a regular file" in err


def test_yml_files_are_not_silently_ignored(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    (root / "contracts" / "foo_v1.yml").write_bytes(V1_YAML.read_bytes())
    err = _assert_refused(root, "list", where="contracts/foo_v1.yml:1:1:")
    assert "rename it to foo_v1.yaml" in err


# --- contractgen.toml ------------------------------------------------------------------------


@pytest.mark.parametrize("generated", [".", "..", "/tmp", "docs", "contracts", "a/../b"])
def test_generated_dir_must_be_a_folder_of_its_own(tmp_path: Path, generated: str) -> None:
    root = make_project(tmp_path / "p", config=f'# project\ngenerated = "{generated}"\n')
    (root / "docs").mkdir()
    (root / "docs" / "guide.md").write_text("a file contractgen did not write\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    verbs = ("generate",) if generated in ("docs", "contracts") else ("generate", "check")
    for verb in verbs:
        err = _assert_refused(root, verb, where="contractgen.toml:2:1:", field="generated")
        assert len(err.strip().splitlines()) == 1


def test_generate_never_deletes_a_file_without_the_header(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    assert cli("--root", root, "generate").exit_code == 0
    stray = root / "generated" / "notes.txt"
    stray.write_text("mine\n")
    err = _assert_refused(root, "generate", field="generated")
    assert "notes.txt" in err and stray.read_text() == "mine\n"


def test_generated_dir_symlinked_out_of_the_project_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = make_project(tmp_path / "p")
    (root / "generated").symlink_to(outside)
    _assert_refused(root, "generate", field="generated")
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    ("config", "where", "field"),
    [
        ("targets = 5\n", "contractgen.toml:1:1:", "targets"),
        ("generated = 3\n", "contractgen.toml:1:1:", "generated"),
        ("contracts = []\n", "contractgen.toml:1:1:", "contracts"),
        ("[targets.sglang]\npackage = 7\n", "contractgen.toml:2:1:", "targets.sglang.package"),
        ("[targets.sglang]\ninit = 'no'\n", "contractgen.toml:2:1:", "targets.sglang.init"),
        ("[targets.vllm]\n", "contractgen.toml:1:1:", "targets.vllm"),
        ("colour = 1\n", "contractgen.toml:1:1:", "colour"),
        ("generated = [\n", "contractgen.toml:", ""),
    ],
)
def test_bad_config_values_name_the_key(
    tmp_path: Path, config: str, where: str, field: str
) -> None:
    root = make_project(tmp_path / "p", config=config)
    for verb in ("list", "generate"):
        _assert_refused(root, verb, where=where, field=field)


# --- check and sync against sibling repos ----------------------------------------------------


def _synced_repo(tmp_path: Path) -> tuple[Path, Path]:
    root = make_project(tmp_path / "p")
    assert cli("--root", root, "generate").exit_code == 0
    repo = sibling_checkout(tmp_path / "sglang", "sglang")
    result = cli("--root", root, "sync", "--repo", f"sglang={repo}")
    assert result.exit_code == 0, (result.output, result.stderr)
    return root, repo / "python/sglang/srt/true_on_policy"


def test_leftover_temp_files_are_reported_by_check_and_removed_by_sync(tmp_path: Path) -> None:
    root, package = _synced_repo(tmp_path)
    # what `kill -9` during atomic_write leaves: a temp file beside its destination
    leftover = package / ".schema.py.k9x_2ab.tmp"
    leftover.write_bytes((package / "schema.py").read_bytes()[:1000])
    repo = package.parents[3]
    check = cli("--root", root, "check", "--repo", f"sglang={repo}")
    assert check.exit_code == 1, check.output
    assert "leftover: sglang:" in check.output and ".schema.py.k9x_2ab.tmp" in check.output
    synced = cli("--root", root, "sync", "--repo", f"sglang={repo}")
    assert synced.exit_code == 0, (synced.output, synced.stderr)
    assert not leftover.exists()
    assert cli("--root", root, "check", "--repo", f"sglang={repo}").exit_code == 0


def test_leftover_temp_files_in_generated_are_removed_by_generate(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    assert cli("--root", root, "generate").exit_code == 0
    folder = root / "generated" / "sglang" / "python/sglang/srt/true_on_policy"
    leftover = folder / ".runtime_policy.py.abc123.tmp"
    leftover.write_text("partial")
    check = cli("--root", root, "check")
    assert check.exit_code == 1 and "leftover: generated/sglang/" in check.output
    assert cli("--root", root, "generate").exit_code == 0
    assert not leftover.exists()


def test_check_repo_reports_extra_files_in_the_vendored_package(tmp_path: Path) -> None:
    root, package = _synced_repo(tmp_path)
    repo = package.parents[3]
    old = package / "old_generated.py"  # stamped: an orphan of an earlier generation
    old.write_bytes((package / "schema.py").read_bytes())
    own = package / "config.py"  # the repo's own module beside the vendored ones
    own.write_text("FLAG = True\n")
    check = cli("--root", root, "check", "--repo", f"sglang={repo}")
    assert check.exit_code == 1, check.output
    assert "orphaned (remove it): sglang:" in check.output and "old_generated.py" in check.output
    # one note per repo, not one per module of its own (issue 30: 14 in Megatron-LM)
    notes = [line for line in check.output.splitlines() if line.startswith("note: ")]
    assert notes == [
        f"note: sglang:{repo.as_posix()}: 1 module(s) of the repo's own beside the vendored "
        "ones, left alone (--json lists them)"
    ]
    assert cli("--root", root, "sync", "--repo", f"sglang={repo}").exit_code == 0
    assert not old.exists() and own.read_text() == "FLAG = True\n"
    assert cli("--root", root, "check", "--repo", f"sglang={repo}").exit_code == 0


def test_check_repo_that_does_not_exist_is_one_line_exit_2(tmp_path: Path) -> None:
    result = cli("check", "--repo", f"sglang={tmp_path / 'nonexistent'}")
    assert result.exit_code == 2
    assert result.stdout.strip() == ""
    assert result.stderr.strip().splitlines() == [
        f"error: --repo sglang={tmp_path / 'nonexistent'}: not a directory"
    ]


def test_sync_leaves_no_lock_file_behind(tmp_path: Path) -> None:
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("contractgen-sync-*.lock"))
    _synced_repo(tmp_path)
    after = set(Path(tempfile.gettempdir()).glob("contractgen-sync-*.lock"))
    assert after <= before


def test_check_json_prints_errors_as_json(tmp_path: Path) -> None:
    import json

    root = _project_with(tmp_path, "theta: 1000000.0", "theta: .nan")
    result = cli("--root", root, "check", "--json")
    assert result.exit_code == 2
    report = json.loads(result.output)
    assert report["ok"] is False
    (error,) = report["errors"]
    assert error["file"] == f"contracts/{V1_ID}.yaml" and error["line"] == 32
    assert error["field"] == "model_profile.rope.theta"


def test_check_names_drift_between_sibling_copies(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p")
    assert cli("--root", root, "generate").exit_code == 0
    repos = {t: tmp_path / t for t in ("sglang", "megatron", "launcher")}
    for target, path in repos.items():
        sibling_checkout(path, target)
    args = [a for t, p in repos.items() for a in ("--repo", f"{t}={p}")]
    assert cli("--root", root, "sync", *args).exit_code == 0
    assert cli("--root", root, "check", *args).exit_code == 0
    # one copy a blank line short: issue 55 asks for byte-identical copies (each repo's
    # formatter keeps the rendered form), so a blank line is drift now (issue 30 allowed it)
    schema = repos["megatron"] / "miles_megatron_plugins/true_on_policy/schema.py"
    text = schema.read_text()
    schema.write_text(text.replace("Literal\n\nSCHEMA_VERSION", "Literal\nSCHEMA_VERSION", 1))
    assert cli("--root", root, "check", *args).exit_code == 1
    # a copy whose code differs (its stamp re-made, as a careless hand edit would) is named
    edited = text.replace("GENERATOR_FORMAT = 3", "GENERATOR_FORMAT = 4", 1)
    head, sep, body = edited.partition("# sha256: ")
    body = body.split("\n", 1)[1]
    stamp = hashlib.sha256(body.encode()).hexdigest()
    schema.write_text(head + sep + stamp + "\n" + body)
    result = cli("--root", root, "check", *args)
    assert result.exit_code == 1
    lines = [line for line in result.stdout.splitlines() if line.startswith("sibling: ")]
    sglang = f"sglang:{repos['sglang'].as_posix()}/python/sglang/srt/true_on_policy/schema.py"
    megatron = (
        f"megatron:{repos['megatron'].as_posix()}/miles_megatron_plugins/true_on_policy/schema.py"
    )
    launcher = f"launcher:{repos['launcher'].as_posix()}/miles/true_on_policy/schema.py"
    assert lines == [
        f"sibling: {sglang} != {megatron}",
        f"sibling: {megatron} != {launcher}",
    ], result.stdout
