"""Issue 30, row by row, on temp git repos laid out like miles, the Megatron-LM fork and sglang
(``public_layouts.py``: written from PUBLIC_STACK.md facts, not copied). Each repo's own test
file passes before and after ``adopt`` with contractgen's own config (the public layout: no
config in the sibling repo); the recipes of docs/sibling-ci.md and the pre-commit hooks pass on
the adopted repos as written; the repos' formatters may run over the vendored files."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .helpers import ROOT, cli, cli_process, files_under, targets_of_repo
from .public_layouts import REPOS, V1, make_repos, own_tests

DOC = (ROOT / "docs" / "sibling-ci.md").read_text()
HOOKS = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
OTHERS = ("qwen3_dense_true_on_policy_v2", "qwen3_moe_true_on_policy_v1",
          "llama3_dense_true_on_policy_v1")  # fmt: skip


def _args(repos: dict[str, Path]) -> list[str]:
    return [a for name, path in repos.items() for a in ("--repo", f"{name}={path}")]


@pytest.fixture(scope="module")
def adopted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The three repos after `contractgen adopt` with contractgen's own config; the repos' own
    tests checked before and after."""
    repos = make_repos(tmp_path_factory.mktemp("public"))
    for name, path in repos.items():
        before = own_tests(name, path)
        assert before.returncode == 0, before.stdout + before.stderr
    result = cli("--root", ROOT, "adopt", *_args(repos))
    assert result.exit_code == 0, result.output + result.stderr
    for name, path in repos.items():
        after = own_tests(name, path)
        assert after.returncode == 0, (name, after.stdout + after.stderr)
    return repos


def _package(name: str, repos: dict[str, Path]) -> Path:
    return repos[name] / REPOS[name][1]


def _py(name: str, repos: dict[str, Path], code: str) -> subprocess.CompletedProcess[str]:
    root = repos[name] / REPOS[name][2]
    script = f"import sys; sys.path.insert(0, {str(root)!r}); {code}"
    return subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True)


# --- row: the repos' own tests; the public wording -------------------------------------------


@pytest.mark.parametrize(
    ("name", "module", "call", "wording"),
    [
        ("miles", "miles.true_on_policy.contracts", "get_true_on_policy_contract(name=X)",
         "Unsupported true-on-policy contract"),
        ("Megatron-LM", "miles_megatron_plugins.true_on_policy.contracts",
         "validate_true_on_policy_contract(contract_name=X)",
         "Unsupported Megatron true-on-policy contract"),
        ("sglang", "sglang.srt.true_on_policy.contracts",
         "get_true_on_policy_contract(contract_name=X)",
         "Unsupported SGLang true-on-policy contract"),
    ],
)  # fmt: skip
def test_adopted_repos_refuse_what_they_do_not_implement(adopted, name, module, call, wording):
    """Row 2: each repo accepts dense v1 only, with its public error type and wording, by the
    public parameter name (miles 58 -> 57 and Megatron-LM 33 -> 32 in the issue's run)."""
    for other in (*OTHERS, "unknown_contract"):
        code = (
            f"import {module} as m\ntry:\n    m.{call.replace('X', repr(other))}\n"
            "except ValueError as e:\n    print('ValueError', e)\n"
        )
        done = _py(name, adopted, code)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == (
            f"ValueError {wording} {other!r}. Supported contracts: {V1}"
        ), done.stdout
    ok = _py(name, adopted, f"import {module} as m; m.{call.replace('X', repr(V1))}; print('ok')")
    assert ok.stdout.strip() == "ok", ok.stderr


def test_vendored_copies_carry_only_the_declared_contract(adopted) -> None:
    """Row 6 (size): each copy holds one contract's data, not five."""
    for name in adopted:
        schema = _package(name, adopted) / "schema.py"
        done = _py(name, adopted, "import runpy; s = runpy.run_path(" + repr(str(schema)) + "); "
                   "print(s['CONTRACT_IDS'], sorted(s['CONTRACT_DATA']))")  # fmt: skip
        assert done.stdout.strip() == f"('{V1}',) ['{V1}']", done.stderr
        assert schema.stat().st_size < 40_000, schema.stat().st_size  # was 98 KB with five


def test_handshake_and_check_pass_on_the_adopted_repos(adopted) -> None:
    ok = cli("handshake", "--rollout", adopted["sglang"], "--trainer", adopted["Megatron-LM"],
             "--contract", V1)  # fmt: skip
    assert ok.exit_code == 0, ok.stderr
    for other in OTHERS:
        refused = cli("handshake", "--rollout", adopted["sglang"], "--trainer",
                      adopted["Megatron-LM"], "--contract", other)  # fmt: skip
        assert refused.exit_code == 1
        assert f"the rollout and the trainer do not implement {other}" in refused.stderr
    check = cli("check", *_args(adopted))
    assert check.exit_code == 0, check.output
    # one note per repo, however many modules of its own the package holds; miles holds no FSDP
    # package (adopt created none), which check names instead of calling it missing
    notes = [line for line in check.output.splitlines() if line.startswith("note:")]
    assert len(notes) == 4, notes
    assert sum("not checked" in n for n in notes) == 1 and any(
        n.startswith("note: fsdp:") and "not checked" in n for n in notes
    ), notes
    own = sum(1 for rel in REPOS["Megatron-LM"][3] if "/" not in rel) - 2  # all but the 2 replaced
    assert own == 8
    assert any(n.startswith("note: megatron:") and f": {own} module(s) of the repo's own" in n
               for n in notes), notes  # fmt: skip


def test_init_false_writes_what_the_docs_say(adopted) -> None:
    """Row 5: with init = false contractgen writes schema.py, runtime_policy.py and contracts.py,
    and leaves the repo's own __init__.py (and every other module) alone."""
    from contractgen.project import open_project

    config = open_project(ROOT).config
    for name, path in adopted.items():
        changed = subprocess.run(["git", "-C", str(path), "status", "--porcelain",
                                  "--untracked-files=all"],
                                 capture_output=True, text=True, check=True).stdout  # fmt: skip
        # every package of the repo's targets that it holds (miles: the launcher's; it has no
        # FSDP package, and adopt creates none without --allow-new-package)
        held = [config.package(t) for t in targets_of_repo(name)]
        packages = [package for package in held if (path / package).is_dir()]
        assert REPOS[name][1] in packages
        assert sorted(line[3:] for line in changed.splitlines() if "__pycache__" not in line) == [
            f"{package}/{module}" for package in sorted(packages)
            for module in ("contracts.py", "runtime_policy.py", "schema.py")
        ], changed  # fmt: skip
    for text in ((ROOT / "README.md").read_text(), DOC):
        assert "`schema.py`, `runtime_policy.py` and `contracts.py`" in " ".join(text.split())


# --- row: docs and recipes pass as written -----------------------------------------------------


def _workflow_steps() -> list[str]:
    block = re.findall(r"```yaml\n(.*?)```", DOC, re.S)[0]
    steps = yaml.safe_load(block)["jobs"]["vendored-contract"]["steps"]
    return [s["run"] for s in steps if "run" in s]


@pytest.mark.parametrize("name", sorted(REPOS))
def test_sibling_ci_recipe_passes_on_each_adopted_repo(adopted, name: str) -> None:
    """The workflow's two run steps, as written (pip install replaced by this checkout)."""
    target, package, _, _ = REPOS[name]
    env = {**os.environ, "PACKAGE": package, "TARGET": target}
    verify, check = _workflow_steps()
    done = subprocess.run(["bash", "-c", verify], cwd=adopted[name], env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verify: ok (3 generated file(s) intact; " in done.stdout
    command = [line for line in check.splitlines() if line.startswith("contractgen check")]
    assert command == ['contractgen check --repo "$TARGET=."']
    ran = cli_process("check", "--repo", f"{target}=.", cwd=adopted[name])
    assert ran.returncode == 0, ran.stdout + ran.stderr


@pytest.mark.parametrize("name", sorted(REPOS))
def test_precommit_hooks_pass_and_catch_an_edit_of_contracts_py(adopted, name, tmp_path) -> None:
    repo = tmp_path / name
    shutil.copytree(adopted[name], repo)
    package = repo / REPOS[name][1]
    pattern = re.compile(HOOKS["contractgen-verify-vendored"]["files"])
    files = [p for p in sorted(package.iterdir()) if pattern.search(p.relative_to(repo).as_posix())]
    assert {p.name for p in files} == {
        "__init__.py",
        "contracts.py",
        "schema.py",
        "runtime_policy.py",
    }
    hook = [str(ROOT / HOOKS["contractgen-verify-vendored"]["entry"]), *map(str, files)]
    ok = subprocess.run(hook, capture_output=True, text=True)  # the repo's own __init__ skipped
    assert ok.returncode == 0, ok.stderr
    check_hook = HOOKS["contractgen-check"]["entry"].split()[1:]
    ran = cli_process(*check_hook, "--repo", f"{REPOS[name][0]}=.", cwd=repo)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    contracts = package / "contracts.py"
    contracts.write_text(contracts.read_text().replace('"policy_for",', '"policy_for", "X",', 1))
    bad = subprocess.run(hook, capture_output=True, text=True)
    assert bad.returncode == 1
    assert "hand-edited or not generated: contracts.py" in bad.stderr


# --- row: the repos' formatters ----------------------------------------------------------------

FORMATTERS = {
    # miles: black at 119 and isort (profile black), from its pyproject.toml
    "miles": [["black", "-q", "."], ["isort", "-q", "."]],
    # Megatron-LM: black 24.4.2 at 100, skip-string-normalization, skip-magic-trailing-comma
    "Megatron-LM": [["black", "-q", "."], ["isort", "-q", "."]],
    # sglang: ruff-format and isort
    "sglang": [["ruff", "format", "-q", "."], ["isort", "-q", "--profile", "black", "."]],
}


VENDORED = ("schema.py", "runtime_policy.py", "contracts.py")
FORMATTED_BY_CONTRACTGEN = ("miles", "Megatron-LM")
"""Repos whose formatters contractgen.toml names (``[targets.NAME.format]``): their vendored
files are rendered in the form those formatters keep. sglang's ruff-format is not one yet."""


def _run_formatters(name: str, repo: Path, package: Path) -> list[str]:
    """The repo's formatters over its vendored package; the vendored files whose bytes moved."""
    before = files_under(package)
    bin_dir = Path(sys.executable).parent
    config_dir = repo / ("python" if name == "sglang" else ".")
    for tool, *args in FORMATTERS[name]:
        argv = [str(bin_dir / tool), *args[:-1], str(package)]  # the repo's config applies
        done = subprocess.run(argv, cwd=config_dir, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    after = files_under(package)
    return [rel for rel in before if rel in VENDORED and before[rel] != after[rel]]


@pytest.mark.parametrize("name", FORMATTED_BY_CONTRACTGEN)
def test_the_repos_formatter_leaves_the_vendored_bytes_alone(adopted, name: str, tmp_path) -> None:
    """Row 7: black / isort with the repo's settings over the vendored files change no byte of
    them (they were rendered in that form); check, sync, verify and the repo's own tests pass,
    and a real edit is still one."""
    pytest.importorskip("black")
    pytest.importorskip("isort")
    repo = tmp_path / name
    shutil.copytree(adopted[name], repo)
    target, package_rel, _, _ = REPOS[name]
    package = repo / package_rel
    assert _run_formatters(name, repo, package) == []
    after = files_under(package)
    check = cli("check", "--repo", f"{target}={repo}")
    assert check.exit_code == 0, check.output
    sync = cli("sync", "--repo", f"{target}={repo}")
    assert (
        sync.exit_code == 0 and "sync: 0 written, 3 already identical" in sync.output
    ), sync.output
    assert files_under(package) == after
    verify = subprocess.run([sys.executable, "-S", str(package / "schema.py"), "--verify",
                             *map(str, sorted(package.glob("*.py")))], capture_output=True, text=True)  # fmt: skip
    assert verify.returncode == 0, verify.stderr
    own = own_tests(name, repo)
    assert own.returncode == 0, own.stdout + own.stderr
    # a change of the code is still an edit: verify and check fail, sync refuses
    policy = package / "runtime_policy.py"
    text = policy.read_text()
    assert text.count('("const", True)') > 1
    policy.write_text(text.replace('("const", True)', '("const", False)', 1))
    assert subprocess.run([sys.executable, "-S", str(package / "schema.py"), "--verify",
                           str(policy)], capture_output=True).returncode == 1  # fmt: skip
    assert cli("check", "--repo", f"{target}={repo}").exit_code == 1
    refused = cli("sync", "--repo", f"{target}={repo}")
    assert refused.exit_code == 1 and "edited by hand" in refused.stderr


def test_an_unconfigured_formatter_that_moves_bytes_is_drift(adopted, tmp_path) -> None:
    """sglang's ruff-format is not among contractgen.toml's formatters: the bytes it moves are
    a difference ``check`` reports (byte-identical copies), naming the file; ``sync --force``
    writes the generated bytes back."""
    repo = tmp_path / "sglang"
    shutil.copytree(adopted["sglang"], repo)
    target, package_rel, _, _ = REPOS["sglang"]
    package = repo / package_rel
    moved = _run_formatters("sglang", repo, package)
    assert moved, "ruff-format left every vendored byte: configure it or drop this test"
    check = cli("check", "--repo", f"{target}={repo}")
    assert check.exit_code == 1 and moved[0] in check.output, check.output
    assert cli("sync", "--force", "--repo", f"{target}={repo}").exit_code == 0
    assert cli("check", "--repo", f"{target}={repo}").exit_code == 0


# --- row: the default config on the public Megatron fork ---------------------------------------


def test_adopt_never_writes_a_second_package_elsewhere(tmp_path: Path) -> None:
    """Row 4: a config pointing Megatron at megatron/core/true_on_policy on a repo that keeps its
    package in miles_megatron_plugins/true_on_policy: refused, the config line printed."""
    repos = make_repos(tmp_path / "r")
    project = tmp_path / "p"
    shutil.copytree(ROOT / "contracts", project / "contracts")
    (project / "contractgen.toml").write_text(
        f'[targets.megatron]\npackage = "megatron/core/true_on_policy"\ncontracts = ["{V1}"]\n'
    )
    before = files_under(repos["Megatron-LM"])
    for verb in ("adopt", "sync"):
        result = cli("--root", project, verb, "--repo", f"megatron={repos['Megatron-LM']}")
        assert result.exit_code == 1, (verb, result.output)
        assert "keeps its true-on-policy package in miles_megatron_plugins/true_on_policy/" in (
            result.stderr + result.output
        )
        assert 'package = "miles_megatron_plugins/true_on_policy"' in result.stderr + result.output
        assert files_under(repos["Megatron-LM"]) == before


def test_a_wheel_has_the_same_builtin_config_as_the_checkout() -> None:
    """A wheel ships no contractgen.toml: its built-in contract sets are a constant, kept equal to
    the checkout's config here (so the sibling CI recipe means the same with a pip install)."""
    from contractgen.codegen.config import load_config
    from contractgen.codegen.paths import BUILTIN_DECLARED
    from contractgen.codegen.targets import TARGETS

    checkout = load_config(ROOT)
    assert checkout.declared == BUILTIN_DECLARED
    assert checkout.packages == {t: TARGETS[t].default_package for t in TARGETS}
    assert checkout.no_init == frozenset(t for t in TARGETS if not TARGETS[t].default_init)
