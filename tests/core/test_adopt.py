"""Issue 12: ``contractgen adopt`` on temporary git repos laid out like the public ones.

The hand-kept packages below are written here from the facts in PUBLIC_STACK.md (where each
package lives, the names its modules define and import), not copied from those repositories.
After ``adopt`` the synced package is imported the way the repo's own modules import it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .helpers import V1_ID, cli, files_under, make_project

CONFIG = """\
[targets.sglang]
init = false

[targets.megatron]
package = "miles_megatron_plugins/true_on_policy"
init = false

[targets.launcher]
init = false
"""

HAND_SCHEMA = """\
from dataclasses import dataclass
from typing import Literal

TrueOnPolicyContractName = Literal["qwen3_dense_true_on_policy_v1"]
ModelFamily = Literal["qwen3_dense", "qwen3_moe", "qwen3_next"]
KernelContract = Literal["qwen3_dense_sglang_math"]
LogprobContract = Literal["sglang_prefill"]


@dataclass(frozen=True)
class TrueOnPolicyContractSchema:
    name: TrueOnPolicyContractName
    model_family: ModelFamily
    required_kernel_contracts: tuple[KernelContract, ...]
    logprob_contract: LogprobContract
    sglang_attention_backend: str
    fsdp_attention_implementation: str
    disable_megatron_sequence_parallel: bool


QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA = TrueOnPolicyContractSchema(
    name="qwen3_dense_true_on_policy_v1",
    model_family="qwen3_dense",
    required_kernel_contracts=("qwen3_dense_sglang_math",),
    logprob_contract="sglang_prefill",
    sglang_attention_backend="fa3",
    fsdp_attention_implementation="flash_attention_3",
    disable_megatron_sequence_parallel=True,
)
"""

SGLANG_MOE = """
QWEN3_MOE_TRUE_ON_POLICY_V1_SCHEMA = TrueOnPolicyContractSchema(
    name="qwen3_moe_true_on_policy_v1",
    model_family="qwen3_moe",
    required_kernel_contracts=("qwen3_dense_sglang_math", "qwen3_moe_sglang_math"),
    logprob_contract="sglang_prefill",
    sglang_attention_backend="fa3",
    fsdp_attention_implementation="flash_attention_3",
    disable_megatron_sequence_parallel=True,
)
"""

# repo -> (target, package, {file: text}), files outside the package first
REPOS = {
    "sglang": (
        "sglang",
        "python/sglang/srt/true_on_policy",
        {
            "python/sglang/__init__.py": "",
            "python/sglang/srt/__init__.py": "",
            "__init__.py": "from .config import rollout_policy\n",
            "schema.py": HAND_SCHEMA + SGLANG_MOE,
            "contracts.py": textwrap.dedent("""\
            from .schema import QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA

            QWEN3_DENSE_TRUE_ON_POLICY_V1 = QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA.name


            def get_true_on_policy_contract(contract_name):
                raise NotImplementedError
            """),
            "config.py": textwrap.dedent("""\
            from .contracts import get_true_on_policy_contract
            from .runtime_policy import resolve_true_on_policy_runtime_policy


            def rollout_policy(server_args):
                return resolve_true_on_policy_runtime_policy(server_args)
            """),
        },
    ),
    "Megatron-LM": (
        "megatron",
        "miles_megatron_plugins/true_on_policy",
        {
            "megatron/__init__.py": "",
            "miles_megatron_plugins/__init__.py": "",
            "__init__.py": "",
            "schema.py": HAND_SCHEMA,
            "contracts.py": textwrap.dedent("""\
            from .schema import QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA

            QWEN3_DENSE_TRUE_ON_POLICY_V1 = QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA.name
            """),
            "norm.py": textwrap.dedent("""\
            from .contracts import QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT, validate_true_on_policy_contract


            def cast_before_weight(config):
                validate_true_on_policy_contract(config.true_on_policy_contract)
                policy = QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT.policy_for(config)
                return policy.cast_qk_norm_input_before_weight_mul
            """),
        },
    ),
    "miles": (
        "launcher",
        "miles/true_on_policy",
        {
            "miles/__init__.py": "",
            "__init__.py": "",
            "schema.py": HAND_SCHEMA,
            "contracts.py": textwrap.dedent("""\
            from .schema import (
                QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA,
                KernelContract,
                LogprobContract,
                ModelFamily,
                TrueOnPolicyContractName,
            )

            QWEN3_DENSE_TRUE_ON_POLICY_V1 = QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA
            """),
            "model_profiles.py": textwrap.dedent("""\
            from .contracts import KernelContract, ModelFamily

            QWEN3_DENSE: ModelFamily = "qwen3_dense"
            KERNELS: tuple[KernelContract, ...] = ("qwen3_dense_sglang_math",)
            """),
            "config.py": textwrap.dedent("""\
            from .contracts import get_true_on_policy_contract


            def kernel_kwargs(name):
                # as miles' config.py calls it: keyword arguments only
                contract = get_true_on_policy_contract(name=name)
                return contract.kernel_policy_kwargs_for(
                    train_backend="megatron", sglang_target="fsdp_tp"
                )
            """),
        },
    ),
}


def _git(path: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True)  # fmt: skip


@pytest.fixture
def stack(tmp_path: Path) -> dict[str, Path]:
    repos = {}
    for repo, (_, package, files) in REPOS.items():
        root = tmp_path / "repos" / repo
        for rel, text in files.items():
            path = root / (rel if "/" in rel else f"{package}/{rel}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        _git(root, "add", "-A")
        _git(root, "commit", "-qm", "hand-kept true_on_policy package")
        repos[repo] = root
    return repos


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = make_project(tmp_path / "project", config=CONFIG)
    assert cli("--root", root, "generate").exit_code == 0
    return root


def _args(stack: dict[str, Path]) -> list[str]:
    return [a for repo, path in stack.items() for a in ("--repo", f"{repo}={path}")]


def _import(path: Path, module: str, code: str) -> str:
    """Import ``module`` from ``path`` in a clean interpreter (-S: no site-packages, so an
    installed package of the same name cannot answer) and run ``code`` there."""
    script = f"import sys; sys.path.insert(0, {str(path)!r}); import {module} as m; {code}"
    proc = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_handshake_on_a_never_generated_copy_says_so(project: Path, stack) -> None:
    result = cli("--root", project, "handshake", "--rollout", stack["sglang"],
                 "--trainer", stack["Megatron-LM"], "--contract", V1_ID)  # fmt: skip
    assert result.exit_code == 1
    assert "never generated by contractgen" in result.stderr
    assert "contractgen adopt --repo" in result.stderr
    assert "edited by hand" not in result.stderr


def test_adopt_reports_names_then_syncs_and_the_repos_import_it(project: Path, stack) -> None:
    before = {r: files_under(p) for r, p in stack.items()}
    dry = cli("--root", project, "adopt", *_args(stack), "--dry-run")
    assert dry.exit_code == 0, (dry.output, dry.stderr)
    assert {r: files_under(p) for r, p in stack.items()} == before
    out = dry.stdout
    # name by name, not a text diff
    assert "+ launcher:miles/true_on_policy/contracts.py: get_true_on_policy_contract" in out
    assert (
        "~ sglang:python/sglang/srt/true_on_policy/contracts.py: get_true_on_policy_contract" in out
    )
    assert "+ sglang:python/sglang/srt/true_on_policy/schema.py: CONTRACT_IDS" in out
    assert "@@" not in out and "REFUSED" not in out
    result = cli("--root", project, "adopt", *_args(stack))
    assert result.exit_code == 0, (result.output, result.stderr)
    assert "adopt:" in result.stdout
    for repo, path in stack.items():  # the repos' own files are left alone
        target, package, files = REPOS[repo]
        for rel, text in files.items():
            if rel not in ("schema.py", "contracts.py") and "/" not in rel:
                assert (path / package / rel).read_text() == text
    assert cli("--root", project, "check", *_args(stack)).exit_code == 0
    # each repo's own modules import the synced package as they always did
    miles = _import(stack["miles"], "miles.true_on_policy.config",
                    f"print(m.kernel_kwargs({V1_ID!r})['tp_invariant_row_linear'])")  # fmt: skip
    assert miles == "True"
    assert (
        _import(stack["miles"], "miles.true_on_policy.model_profiles", "print(m.QWEN3_DENSE)")
        == "qwen3_dense"
    )
    megatron = _import(
        stack["Megatron-LM"], "miles_megatron_plugins.true_on_policy.norm",
        "from types import SimpleNamespace as N; "
        f"print(m.cast_before_weight(N(true_on_policy_contract={V1_ID!r})))",
    )  # fmt: skip
    assert megatron == "True"
    sglang = _import(
        stack["sglang"] / "python", "sglang.srt.true_on_policy",
        "from types import SimpleNamespace as N; "
        f"print(m.rollout_policy(N(true_on_policy_contract={V1_ID!r}, tp_size=2)).tp_invariant_row_linear); "
        "from sglang.srt.true_on_policy.schema import QWEN3_MOE_TRUE_ON_POLICY_V1_SCHEMA as moe; "
        "print(moe.model_family)",
    )  # fmt: skip
    assert sglang.splitlines() == ["True", "qwen3_moe"]
    ok = cli("--root", project, "handshake", "--rollout", stack["sglang"],
             "--trainer", stack["Megatron-LM"], "--contract", V1_ID)  # fmt: skip
    assert ok.exit_code == 0, ok.stderr


def test_adopt_refuses_to_drop_a_public_name_unless_allowed(project: Path, stack) -> None:
    schema = stack["sglang"] / "python/sglang/srt/true_on_policy/schema.py"
    schema.write_text(schema.read_text() + "\nLEGACY_TOGGLE = True\n")
    before = files_under(stack["sglang"])
    refused = cli("--root", project, "adopt", "--repo", f"sglang={stack['sglang']}")
    assert refused.exit_code == 1
    assert (
        "- sglang:python/sglang/srt/true_on_policy/schema.py: LEGACY_TOGGLE (REFUSED"
        in refused.stdout
    )
    assert "LEGACY_TOGGLE" in refused.stderr and "nothing written" in refused.stderr
    assert files_under(stack["sglang"]) == before
    allowed = cli("--root", project, "adopt", "--repo", f"sglang={stack['sglang']}",
                  "--allow-drop", "LEGACY_TOGGLE")  # fmt: skip
    assert allowed.exit_code == 0, (allowed.output, allowed.stderr)
    assert "LEGACY_TOGGLE" not in schema.read_text()
