"""``contractgen sync`` and ``check --repo`` against temporary git repos laid out like sglang,
Megatron-LM and miles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from contractgen.codegen.config import load_config
from contractgen.codegen.sync import repo_lock, sync
from contractgen.project import open_project

from .helpers import PACKAGES, ROOT, cli, files_under, make_project, targets_of_repo

# Each sibling repo with a little of its own code, as in the public repositories.
LAYOUTS = {
    "sglang": (
        "sglang",
        ["python/sglang/__init__.py", "python/sglang/srt/__init__.py", "README.md"],
    ),
    "megatron": (
        "Megatron-LM",
        [
            "megatron/__init__.py",
            "megatron/core/__init__.py",
            "miles_megatron_plugins/__init__.py",
            "setup.py",
        ],
    ),
    "launcher": (
        "miles",
        [
            "miles/__init__.py",
            "miles/utils/__init__.py",
            "miles/backends/fsdp_utils/__init__.py",  # the fsdp target's anchor
            "pyproject.toml",
        ],
    ),
}
MEGATRON_PLUGINS = "miles_megatron_plugins/true_on_policy"


def _git_repo(path: Path, files: list[str]) -> Path:
    path.mkdir(parents=True)
    for rel in files:
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(f"# {rel} of {path.name}\n")
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "add", "-A"], check=True)
    subprocess.run(
        [
            "git",
            "-C",
            str(path),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "init",
        ],
        check=True,
    )
    return path


@pytest.fixture
def repos(tmp_path: Path) -> dict[str, Path]:
    return {t: _git_repo(tmp_path / "repos" / name, files) for t, (name, files) in LAYOUTS.items()}


def _repo_args(
    repos: dict[str, Path], names: tuple[str, ...] = ("sglang", "megatron", "launcher")
) -> list[str]:
    args: list[str] = []
    for t in names:
        args += ["--repo", f"{LAYOUTS[t][0]}={repos[t]}"]  # repo names: sglang, Megatron-LM, miles
    return args


def _sync(*args: str | os.PathLike):
    return cli("--root", ROOT, "sync", *args)


def _snapshot(repos: dict[str, Path]) -> dict[str, dict[str, bytes]]:
    return {
        t: {k: v for k, v in files_under(r).items() if not k.startswith(".git/")}
        for t, r in repos.items()
    }


def _generated(target: str) -> dict[str, bytes]:
    """What sync vendors into ``target``'s repo (only the contracts it implements)."""
    prefix = f"{target}/"
    vendored = open_project(ROOT).vendored
    return {k[len(prefix) :]: v for k, v in vendored.items() if k.startswith(prefix)}


def _in_repo(key: str) -> dict[str, bytes]:
    """What sync vendors into the repo of fixture ``key`` (every target of that repo)."""
    return {k: v for t in targets_of_repo(LAYOUTS[key][0]) for k, v in _generated(t).items()}


def _all_vendored() -> int:
    """How many files a sync into every fixture repo writes (registry-derived)."""
    return sum(len(_in_repo(key)) for key in LAYOUTS)


def _untracked(repo: Path) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=all"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sorted(line[3:] for line in out.splitlines())


# --------------------------------------------------------------------------------------------
# create, idempotence


def test_sync_creates_vendored_packages_and_touches_nothing_else(repos) -> None:
    before = _snapshot(repos)
    result = _sync(*_repo_args(repos))
    assert result.exit_code == 0, result.output + result.stderr
    assert f"sync: {_all_vendored()} written, 0 already identical" in result.output
    after = _snapshot(repos)
    for key, repo in repos.items():
        expected = _in_repo(key)
        assert {k: after[key][k] for k in expected} == expected
        # the repo's own files are untouched and only the packages are new
        assert {k: v for k, v in after[key].items() if k not in expected} == before[key]
        assert _untracked(repo) == sorted(expected)
        packages = [PACKAGES[t] + "/" for t in targets_of_repo(LAYOUTS[key][0])]
        assert all(any(k.startswith(p) for p in packages) for k in expected)
    # a miles checkout gets both of its targets' packages, each beside that target's code
    miles = {PACKAGES[t] for t in targets_of_repo("miles")}
    assert miles == {"miles/true_on_policy", "miles/backends/fsdp_utils/true_on_policy"}
    for package in miles:
        assert (repos["launcher"] / package / "schema.py").is_file()


def test_sync_is_idempotent(repos) -> None:
    assert _sync(*_repo_args(repos)).exit_code == 0
    stats = {p: p.stat().st_mtime_ns for r in repos.values() for p in r.rglob("*.py")}
    time.sleep(0.01)
    again = _sync(*_repo_args(repos))
    assert again.exit_code == 0
    assert f"sync: 0 written, {_all_vendored()} already identical" in again.output
    assert {p: p.stat().st_mtime_ns for p in stats} == stats
    dry = _sync(*_repo_args(repos), "--dry-run")
    assert dry.exit_code == 0
    assert "0 file(s) would change" in dry.output


def test_sync_accepts_target_names_and_repo_names(repos) -> None:
    result = _sync("--repo", f"launcher={repos['launcher']}", "--repo", f"sglang={repos['sglang']}")
    assert result.exit_code == 0, result.stderr
    assert (repos["launcher"] / PACKAGES["launcher"] / "schema.py").is_file()


# --------------------------------------------------------------------------------------------
# refusal, --force


def _hand_edit(repo: Path, target: str) -> Path:
    path = repo / PACKAGES[target] / "runtime_policy.py"
    path.write_text(path.read_text().replace('("const", True)', '("const", False)', 1))
    return path


def test_refuses_hand_edited_file_and_writes_nothing_anywhere(repos) -> None:
    assert _sync("--repo", f"megatron={repos['megatron']}").exit_code == 0
    edited = _hand_edit(repos["megatron"], "megatron")
    before = _snapshot(repos)
    result = _sync(*_repo_args(repos))
    assert result.exit_code == 1
    assert f"refused: {edited}: edited by hand" in result.stderr
    assert "sync: nothing written" in result.stderr
    assert _snapshot(repos) == before  # not even the other two repos
    assert not (repos["sglang"] / PACKAGES["sglang"]).exists()


def test_force_overwrites_a_hand_edit(repos) -> None:
    assert _sync(*_repo_args(repos)).exit_code == 0
    edited = _hand_edit(repos["megatron"], "megatron")
    result = _sync(*_repo_args(repos), "--force")
    assert result.exit_code == 0, result.stderr
    assert f"sync: 1 written, {_all_vendored() - 1} already identical" in result.output
    assert (
        edited.read_bytes() == _generated("megatron")[f"{PACKAGES['megatron']}/runtime_policy.py"]
    )


def test_refuses_a_file_contractgen_did_not_write_unless_forced(repos) -> None:
    own = repos["launcher"] / PACKAGES["launcher"] / "schema.py"
    own.parent.mkdir(parents=True)
    own.write_text('"""miles\' own hand-kept schema."""\n')
    result = _sync("--repo", f"miles={repos['launcher']}")
    assert result.exit_code == 1
    assert (
        "exists and was not generated by contractgen (use --force to replace it)" in result.stderr
    )
    assert own.read_text() == '"""miles\' own hand-kept schema."""\n'
    assert not (own.parent / "runtime_policy.py").exists()
    forced = _sync("--repo", f"miles={repos['launcher']}", "--force")
    assert forced.exit_code == 0
    assert own.read_bytes() == _generated("launcher")[f"{PACKAGES['launcher']}/schema.py"]


# --------------------------------------------------------------------------------------------
# --dry-run


def test_dry_run_shows_a_diff_and_writes_nothing(repos) -> None:
    before = _snapshot(repos)
    result = _sync(*_repo_args(repos), "--dry-run")
    assert result.exit_code == 0
    assert _snapshot(repos) == before
    assert f"would create: megatron:{PACKAGES['megatron']}/schema.py" in result.output
    assert (
        "+++ megatron:miles_megatron_plugins/true_on_policy/schema.py (rendered)" in result.output
    )
    assert "+# Generated by contractgen (format 3). DO NOT EDIT." in result.output
    assert (
        f"sync --dry-run: {_all_vendored()} file(s) would change; nothing written" in result.output
    )


def test_dry_run_of_an_update_shows_the_changed_lines(repos) -> None:
    assert _sync(*_repo_args(repos)).exit_code == 0
    _hand_edit(repos["sglang"], "sglang")
    before = _snapshot(repos)
    result = _sync("--repo", f"sglang={repos['sglang']}", "--dry-run", "--force")
    assert result.exit_code == 0
    assert _snapshot(repos) == before
    assert '-        "enabled": ("const", False),' in result.output
    assert '+        "enabled": ("const", True),' in result.output


# --------------------------------------------------------------------------------------------
# path escape


def test_symlinked_package_dir_pointing_outside_is_refused(repos, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    link = repos["launcher"] / PACKAGES["launcher"]
    link.symlink_to(outside, target_is_directory=True)
    result = _sync(*_repo_args(repos))
    assert result.exit_code == 2
    assert "outside" in result.stderr and "refusing to write through it" in result.stderr
    assert list(outside.iterdir()) == []
    assert not (repos["sglang"] / PACKAGES["sglang"]).exists()  # nothing written anywhere


def test_symlinked_parent_dir_pointing_outside_is_refused(repos, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir(parents=True)
    mega = repos["megatron"] / "miles_megatron_plugins"
    for p in sorted(mega.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    mega.rmdir()
    mega.symlink_to(outside, target_is_directory=True)
    result = _sync("--repo", f"megatron={repos['megatron']}")
    assert result.exit_code == 2
    assert not (outside / "true_on_policy").exists()


def test_symlink_inside_the_repo_is_fine_but_a_symlinked_file_is_refused(repos) -> None:
    pkg = repos["launcher"] / PACKAGES["launcher"]
    pkg.mkdir(parents=True)
    (pkg / "schema.py").symlink_to(repos["launcher"] / "pyproject.toml")
    result = _sync("--repo", f"miles={repos['launcher']}")
    assert result.exit_code == 1
    assert "is a directory or symlink" in result.stderr
    assert (repos["launcher"] / "pyproject.toml").read_text() == "# pyproject.toml of miles\n"


@pytest.mark.parametrize(
    "package",
    [
        "../escape/true_on_policy",
        "/tmp/true_on_policy",
        "megatron/../../x",
        "./megatron/core",
        "a\\b",
    ],
)
def test_config_package_path_must_stay_inside(package: str, tmp_path: Path) -> None:
    project = make_project(
        tmp_path / "p",
        config=f'[targets.megatron]\npackage = "{package.replace(chr(92), chr(92) * 2)}"\n',
    )
    repo = tmp_path / "Megatron-LM"
    repo.mkdir()
    result = cli("--root", project, "sync", "--repo", f"megatron={repo}")
    assert result.exit_code == 2
    assert "must be a relative path inside the repo" in result.stderr
    assert list(repo.iterdir()) == []
    assert not (tmp_path / "escape").exists()


def test_safe_destination_rejects_escapes(tmp_path: Path) -> None:
    from contractgen.codegen.writer import UnsafePathError, safe_destination

    for bad in ["../x.py", "/etc/passwd", "a/../../x.py", "", "a\\..\\x.py"]:
        with pytest.raises(UnsafePathError):
            safe_destination(tmp_path, bad)
    assert safe_destination(tmp_path, "a/b.py") == tmp_path / "a" / "b.py"


# --------------------------------------------------------------------------------------------
# lock: two syncs cannot interleave


def test_a_sync_waits_for_the_repo_lock(repos) -> None:
    """While another sync holds a repo's lock, a second sync process neither plans nor writes."""
    repo = repos["launcher"]
    with repo_lock(repo):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "contractgen",
                "--root",
                str(ROOT),
                "sync",
                "--repo",
                f"miles={repo}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.5)
        assert proc.poll() is None, "sync finished while the lock was held"
        assert not (repo / PACKAGES["launcher"]).exists()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (repo / PACKAGES["launcher"] / "schema.py").is_file()


def test_concurrent_syncs_in_threads_leave_a_consistent_result(repos) -> None:
    project = open_project(ROOT)
    targets = [(t, repos[t]) for t in ("sglang", "megatron", "launcher")]
    results: list[object] = []

    def run() -> None:
        try:
            plan, written = sync(project.vendored, targets, project.config)
            results.append(len(written))
        except Exception as exc:  # pragma: no cover - reported below
            results.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [0, 0, 0, 9], results  # one wrote everything, the rest nothing
    for target, repo in repos.items():
        expected = _generated(target)
        got = {k: v for k, v in files_under(repo).items() if k in expected}
        assert got == expected
        leftovers = [p for p in (repo / PACKAGES[target]).iterdir() if p.name.endswith(".tmp")]
        assert leftovers == []


# --------------------------------------------------------------------------------------------
# check --repo, orphans, --json


def test_check_repo_reports_missing_then_ok_then_stale(repos) -> None:
    missing = cli("--root", ROOT, "check", "--repo", f"sglang={repos['sglang']}")
    assert missing.exit_code == 1
    assert (
        f"missing: sglang:{repos['sglang'].as_posix()}/{PACKAGES['sglang']}/schema.py"
        in missing.output
    )
    assert _sync(*_repo_args(repos)).exit_code == 0
    ok = cli("--root", ROOT, "check", *_repo_args(repos))
    assert ok.exit_code == 0, ok.output
    assert f"check: ok ({len(open_project(ROOT).rendered)} files, 4 location(s))" in ok.output
    _hand_edit(repos["megatron"], "megatron")
    stale = cli("--root", ROOT, "check", *_repo_args(repos))
    assert stale.exit_code == 1
    assert (
        f"stale: megatron:{repos['megatron'].as_posix()}/{PACKAGES['megatron']}/runtime_policy.py"
        in stale.output
    )
    assert "--- megatron:" in stale.output and "+++ megatron:" in stale.output
    assert "check: 1 file(s) differ" in stale.stderr


def test_check_reports_orphaned_and_stale_files_in_generated(project: Path) -> None:
    assert cli("--root", project, "generate").exit_code == 0
    assert cli("--root", project, "check").exit_code == 0
    orphan = project / "generated" / "sglang" / PACKAGES["sglang"] / "old_module.py"
    # a file contractgen wrote (stamped) that no contract produces any more; an unstamped one is
    # never deleted (tests/core/test_hardening.py)
    orphan.write_bytes((orphan.parent / "schema.py").read_bytes())
    stale = project / "generated" / "launcher" / PACKAGES["launcher"] / "__init__.py"
    stale.write_text(stale.read_text() + "\n")
    result = cli("--root", project, "check")
    assert result.exit_code == 1
    assert (
        f"orphaned (remove it): generated/sglang/{PACKAGES['sglang']}/old_module.py"
        in result.output
    )
    assert f"stale: generated/launcher/{PACKAGES['launcher']}/__init__.py" in result.output
    regenerated = cli("--root", project, "generate")
    assert regenerated.exit_code == 0
    assert "removed generated/sglang" in regenerated.output
    assert not orphan.exists()
    assert cli("--root", project, "check").exit_code == 0


def test_check_json_shape(project: Path, repos) -> None:
    assert cli("--root", project, "generate").exit_code == 0
    (project / "generated" / "orphan.py").write_text("")
    result = cli("--root", project, "check", "--json", "--repo", f"miles={repos['launcher']}")
    assert result.exit_code == 1
    report = json.loads(result.output)
    keys = {"ok", "contracts", "implemented", "files", "drift", "not_generated", "not_checked"}
    assert set(report) == keys
    assert report["not_checked"] == []  # a miles holding none of its packages: each is missing
    assert report["ok"] is False
    assert report["contracts"] == [
        "llama3_dense_lora_true_on_policy_v1",
        "llama3_dense_true_on_policy_v1",
        "llama3_dense_true_on_policy_v2",
        "qwen3_dense_lora_true_on_policy_v1",
        "qwen3_dense_true_on_policy_v1",
        "qwen3_dense_true_on_policy_v2",
        "qwen3_dense_true_on_policy_v3",
        "qwen3_dense_true_on_policy_v4",
        "qwen3_moe_true_on_policy_v1",
        "qwen3_moe_true_on_policy_v2",
        "qwen3_moe_true_on_policy_v3",
        "qwen3_next_true_on_policy_v1",
    ]
    assert report["files"] == len(open_project(project).rendered)
    kinds = sorted((d["kind"], d["where"]) for d in report["drift"])
    # init = false by default: schema.py, runtime_policy.py and contracts.py, for each target of
    # the miles repo (fsdp and launcher)
    miles = targets_of_repo("miles")
    assert kinds == sorted([("missing", t) for t in miles] * 3 + [("orphaned", "generated")])
    assert report["implemented"] == {t: report["contracts"] for t in miles}  # none declared: all
    for d in report["drift"]:
        assert set(d) == {"kind", "where", "path", "rel", "diff"}
    ok = cli("--root", ROOT, "check", "--json")
    assert ok.exit_code == 0 and json.loads(ok.output)["drift"] == []


def test_list_json_shape() -> None:
    result = cli("--root", ROOT, "list", "--json")
    assert result.exit_code == 0
    rows = json.loads(result.output)
    assert [r["id"] for r in rows] == [
        "llama3_dense_lora_true_on_policy_v1",
        "llama3_dense_true_on_policy_v1",
        "llama3_dense_true_on_policy_v2",
        "qwen3_dense_lora_true_on_policy_v1",
        "qwen3_dense_true_on_policy_v1",
        "qwen3_dense_true_on_policy_v2",
        "qwen3_dense_true_on_policy_v3",
        "qwen3_dense_true_on_policy_v4",
        "qwen3_moe_true_on_policy_v1",
        "qwen3_moe_true_on_policy_v2",
        "qwen3_moe_true_on_policy_v3",
        "qwen3_next_true_on_policy_v1",
    ]
    for r in rows:
        assert set(r) == {"id", "family", "logprob_contract", "supersedes", "fingerprint", "file"}
        assert r["fingerprint"].startswith("sha256:") and len(r["fingerprint"]) == 71


# --------------------------------------------------------------------------------------------
# config: another Megatron package path, init = true / false


SEED_MEGATRON = "megatron/core/true_on_policy"


def test_custom_megatron_package_path(tmp_path: Path) -> None:
    """The public fork's path is the default; another one (the seed layout's) is one config line,
    and ``init = true`` vendors contractgen's __init__.py too."""
    assert load_config(ROOT).package("megatron") == MEGATRON_PLUGINS
    project = make_project(
        tmp_path / "p", config=f'[targets.megatron]\npackage = "{SEED_MEGATRON}"\ninit = true\n'
    )
    assert load_config(project).package("megatron") == SEED_MEGATRON
    gen = cli("--root", project, "generate")
    assert gen.exit_code == 0, gen.stderr
    assert (project / "generated" / "megatron" / SEED_MEGATRON / "schema.py").is_file()
    repo = _git_repo(tmp_path / "Megatron-LM", ["megatron/core/__init__.py", "setup.py"])
    result = cli("--root", project, "sync", "--repo", f"Megatron-LM={repo}")
    assert result.exit_code == 0, result.stderr
    assert not (repo / "miles_megatron_plugins").exists()
    assert _untracked(repo) == [
        f"{SEED_MEGATRON}/{f}"
        for f in ("__init__.py", "contracts.py", "runtime_policy.py", "schema.py")
    ]
    probe = subprocess.run(
        [sys.executable, "-S", "-I", "-c",
         f"import sys; sys.path.insert(0, {str(repo)!r}); "
         "from megatron.core.true_on_policy import runtime_policy as rp; "
         "print(rp.policy_for('qwen3_dense_true_on_policy_v1').attention_backend)"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "fa3_varlen"
    assert cli("--root", project, "check", "--repo", f"megatron={repo}").exit_code == 0


def test_init_false_keeps_the_repos_own_package_init(tmp_path: Path) -> None:
    """miles' true_on_policy/__init__.py re-exports its launcher helpers: with ``init = false``
    (the default) contractgen vendors schema.py, runtime_policy.py and contracts.py beside it and
    leaves it alone. contractgen's own generated/ holds every file (its in-tree build)."""
    project = make_project(tmp_path / "p", config="[targets.launcher]\ninit = false\n")
    repo = _git_repo(tmp_path / "miles", ["miles/__init__.py"])
    pkg = repo / PACKAGES["launcher"]
    pkg.mkdir()
    own_init = "from .config import LAUNCH_HELPER\n"
    (pkg / "__init__.py").write_text(own_init)
    (pkg / "config.py").write_text(
        "from .runtime_policy import policy_for\nLAUNCH_HELPER = policy_for\n"
    )
    assert cli("--root", project, "generate").exit_code == 0
    assert not any(k.endswith("__init__.py") for k in open_project(project).vendored)
    result = cli("--root", project, "sync", "--repo", f"launcher={repo}")
    assert result.exit_code == 0, result.stderr
    assert "sync: 3 written, 0 already identical" in result.output
    assert sorted(p.name for p in pkg.iterdir()) == [
        "__init__.py", "config.py", "contracts.py", "runtime_policy.py", "schema.py",
    ]  # fmt: skip
    assert (pkg / "__init__.py").read_text() == own_init
    probe = subprocess.run(
        [sys.executable, "-S", "-I", "-c",
         f"import sys; sys.path.insert(0, {str(repo)!r}); import miles.true_on_policy as p; "
         "print(p.LAUNCH_HELPER('qwen3_dense_true_on_policy_v1').transformer_impl)"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "local"
    assert cli("--root", project, "check", "--repo", f"launcher={repo}").exit_code == 0


def test_init_must_be_a_boolean(tmp_path: Path) -> None:
    project = make_project(tmp_path / "p", config='[targets.launcher]\ninit = "no"\n')
    result = cli("--root", project, "check")
    assert result.exit_code == 2
    assert "targets.launcher.init: must be true or false (got 'no')" in result.stderr


def test_dry_run_with_a_refusal_shows_every_diff_and_exits_1(repos) -> None:
    own = repos["launcher"] / PACKAGES["launcher"] / "schema.py"
    own.parent.mkdir(parents=True)
    own.write_text("HAND_KEPT = True\n")
    before = _snapshot(repos)
    result = _sync("--repo", f"miles={repos['launcher']}", "--dry-run")
    assert result.exit_code == 1
    assert f"would update (refused): launcher:{PACKAGES['launcher']}/schema.py" in result.output
    assert "-HAND_KEPT = True" in result.output
    assert f"would create: launcher:{PACKAGES['launcher']}/runtime_policy.py" in result.output
    assert "sync: nothing written" in result.stderr
    assert _snapshot(repos) == before


def test_check_diffs_for_missing_and_orphaned_files(project: Path) -> None:
    assert cli("--root", project, "generate").exit_code == 0
    (project / "generated" / "orphan.py").write_bytes(b"x = 1")  # no final newline
    (project / "generated" / "sglang" / PACKAGES["sglang"] / "__init__.py").unlink()
    stale = project / "generated" / "megatron" / PACKAGES["megatron"] / "__init__.py"
    stale.write_bytes(b"x = 1")  # no final newline
    result = cli("--root", project, "check")
    assert result.exit_code == 1
    out = result.output
    assert f"+++ generated/sglang/{PACKAGES['sglang']}/__init__.py (rendered)" in out
    assert "+# Generated by contractgen (format 3). DO NOT EDIT." in out
    # issue 55: an orphan is one line saying what to do, not its whole body as a deletion diff
    assert "orphaned (remove it): generated/orphan.py\n" in out
    assert "--- generated/orphan.py (on disk)" not in out
    assert "-x = 1\n\\ No newline at end of file\n" in out  # the stale file's diff


def test_a_repo_without_a_targets_anchor_is_refused_with_nothing_written(tmp_path: Path) -> None:
    """A miles checkout without miles/backends/fsdp_utils/ (the fsdp package's anchor): ``--repo
    miles=`` stands for both miles targets, so sync and adopt refuse, one line naming the missing
    anchor, exit 2, nothing written; ``--repo launcher=`` writes the launcher's package alone."""
    repo = _git_repo(tmp_path / "miles", ["miles/__init__.py", "pyproject.toml"])
    before = files_under(repo)
    for verb in ("sync", "adopt"):
        result = cli("--root", ROOT, verb, "--repo", f"miles={repo}")
        assert result.exit_code == 2, (verb, result.output, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert lines == [
            f"error: --repo fsdp={repo}: no miles/backends/fsdp_utils/ there, the folder fsdp's "
            "package miles/backends/fsdp_utils/true_on_policy/ goes in; point it at a miles "
            "checkout that has miles/backends/fsdp_utils/, or set [targets.fsdp] package = "
            '"…" in contractgen.toml'
        ], verb
        assert files_under(repo) == before, verb
    launcher = cli("--root", ROOT, "sync", "--repo", f"launcher={repo}")
    assert launcher.exit_code == 0, launcher.stderr
    assert (repo / PACKAGES["launcher"] / "schema.py").is_file()
    assert not (repo / "miles" / "backends").exists()
