"""Temporary git repos laid out like the three public repositories (issue 30).

Written here from the facts in ``shared/PUBLIC_STACK.md`` and the issue (where each package
lives, the names and parameter names its modules define and import, the values of the dense v1
contract, each repo's refusal wording and formatter settings), not copied from those
repositories. Each repo also gets a small test file of its own, in the style of the public repos'
true-on-policy tests, that must pass before and after ``adopt``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

V1 = "qwen3_dense_true_on_policy_v1"

SCHEMA = textwrap.dedent("""\
    from __future__ import annotations

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
""")

SGLANG_MOE_SCHEMA = textwrap.dedent("""\


    QWEN3_MOE_TRUE_ON_POLICY_V1_SCHEMA = TrueOnPolicyContractSchema(
        name="qwen3_moe_true_on_policy_v1",
        model_family="qwen3_moe",
        required_kernel_contracts=("qwen3_dense_sglang_math", "qwen3_moe_sglang_math"),
        logprob_contract="sglang_prefill",
        sglang_attention_backend="fa3",
        fsdp_attention_implementation="flash_attention_3",
        disable_megatron_sequence_parallel=True,
    )
""")

# (field, annotation, value under v1 as an expression of the layout flags, value with no
# contract); the 18 Megatron fields in public order
MEGATRON_FIELDS = [
    ("enabled", "bool", "True", "False"),
    ("use_sglang_backend", "bool", "True", "False"),
    ("batch_invariant_mode", "bool", 'getattr(config, "batch_invariant_mode", False)', "False"),
    ("disable_rope_fusion", "bool", "True", "False"),
    ("disable_bias_swiglu_fusion", "bool", "True", "False"),
    ("attention_backend", "str", '"fa3_varlen"', '"default"'),
    ("cp_layout", "Optional[str]", '"ulysses_a2a" if ulysses else None', "None"),
    ("cast_attention_input_to_dense_math_dtype", "bool", "True", "False"),
    ("cast_qk_norm_input_before_weight_mul", "bool", "True", "True"),
    ("cast_qk_after_rope_to_dense_math_dtype", "bool", "True", "False"),
    ("cast_lm_head_input_to_weight_dtype", "bool", "True", "False"),
    ("deterministic_row_parallel_reduce", "bool", "True", "False"),
    ("defer_ulysses_cp_loss_scaling_to_grad_sum", "bool", "True", "False"),
    ("apply_logits_contract", "bool", "True", "False"),
    ("use_sglang_final_norm", "bool", "True", "False"),
    ("use_sglang_residual_pair", "bool", "True", "False"),
    ("use_ulysses_cp_recompute_fallback", "bool", "ulysses", "False"),
]

SGLANG_FIELDS = [
    ("enabled", "True"),
    ("force_bfloat16_dense_tensor_math", "True"),
    ("force_bfloat16_lm_head", "True"),
    ("disable_reduce_scatter", "True"),
    ("disable_mlp_allreduce_fusion", "True"),
    ("disable_flashinfer_allreduce_fusion", "tp"),
    ("tp_invariant_row_linear", "tp"),
    ("deterministic_tree_all_reduce", "tp"),
    ("disable_fused_qk_norm_mrope", "True"),
]


def _indent(lines: list[str], n: int) -> str:
    return "\n".join(" " * n + line for line in lines)


def _registry(error: str, param: str, cls: str) -> str:
    return textwrap.dedent(f"""\


        _REGISTRY = {{QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT.name: QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT}}


        def get_true_on_policy_contract({param}: str) -> {cls}:
            if {param} in _REGISTRY:
                return _REGISTRY[{param}]
            names = ", ".join(sorted(_REGISTRY))
            raise ValueError(f"{error} {{{param}!r}}. Supported contracts: {{names}}")
        """)


def megatron_contracts() -> str:
    fields = _indent([f"{n}: {a}" for n, a, _, _ in MEGATRON_FIELDS], 4)
    default = _indent([f"{n}={off}," for n, _, _, off in MEGATRON_FIELDS], 4)
    v1 = _indent([f"{n}={on}," for n, _, on, _ in MEGATRON_FIELDS], 12)
    return (
        "from __future__ import annotations\n\n"
        "from dataclasses import dataclass\nfrom typing import Optional\n\n"
        "from .schema import QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA, TrueOnPolicyContractSchema\n\n"
        "QWEN3_DENSE_TRUE_ON_POLICY_V1 = QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA.name\n\n\n"
        "def _ulysses(config) -> bool:\n"
        '    comm = getattr(config, "cp_comm_type", None)\n'
        '    a2a = comm == "a2a" if isinstance(comm, str) else isinstance(comm, list) and "a2a" in comm\n'
        '    return getattr(config, "context_parallel_size", 1) > 1 and a2a\n\n\n'
        "@dataclass(frozen=True)\nclass MegatronTrueOnPolicyRuntimePolicy:\n"
        f"    contract_name: Optional[str]\n{fields}\n\n\n"
        "DEFAULT_RUNTIME_POLICY = MegatronTrueOnPolicyRuntimePolicy(\n"
        f"    contract_name=None,\n{default}\n)\n\n\n"
        "@dataclass(frozen=True)\nclass MegatronTrueOnPolicyContract:\n"
        "    schema: TrueOnPolicyContractSchema\n\n"
        "    @property\n    def name(self) -> str:\n        return self.schema.name\n\n"
        "    def policy_for(self, config) -> MegatronTrueOnPolicyRuntimePolicy:\n"
        "        ulysses = _ulysses(config)\n"
        "        return MegatronTrueOnPolicyRuntimePolicy(\n"
        f"            contract_name=self.name,\n{v1}\n        )\n\n\n"
        "QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT = MegatronTrueOnPolicyContract(\n"
        "    schema=QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA\n)"
        + _registry(
            "Unsupported Megatron true-on-policy contract",
            "contract_name",
            "MegatronTrueOnPolicyContract",
        )
        + textwrap.dedent("""

            def validate_true_on_policy_contract(contract_name) -> None:
                if contract_name is not None:
                    get_true_on_policy_contract(contract_name)


            def resolve_true_on_policy_runtime_policy(config) -> MegatronTrueOnPolicyRuntimePolicy:
                name = getattr(config, "true_on_policy_contract", None)
                if name is None:
                    return DEFAULT_RUNTIME_POLICY
                validate_true_on_policy_contract(name)
                return get_true_on_policy_contract(name).policy_for(config)
            """)
    )


def sglang_contracts() -> str:
    fields = _indent([f"{n}: bool" for n, _ in SGLANG_FIELDS], 4)
    default = _indent([f"{n}=False," for n, _ in SGLANG_FIELDS], 4)
    v1 = _indent([f"{n}={on}," for n, on in SGLANG_FIELDS], 12)
    return (
        "from __future__ import annotations\n\n"
        "from dataclasses import dataclass\nfrom typing import Any, Optional\n\n"
        "from sglang.srt.true_on_policy.schema import (\n"
        "    QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA,\n    TrueOnPolicyContractSchema,\n)\n\n"
        "QWEN3_DENSE_TRUE_ON_POLICY_V1 = QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA.name\n\n\n"
        "@dataclass(frozen=True)\nclass SGLangTrueOnPolicyRuntimePolicy:\n"
        f"    contract_name: Optional[str]\n{fields}\n\n\n"
        "DEFAULT_RUNTIME_POLICY = SGLangTrueOnPolicyRuntimePolicy(\n"
        f"    contract_name=None,\n{default}\n)\n\n\n"
        "@dataclass(frozen=True)\nclass SGLangTrueOnPolicyContract:\n"
        "    schema: TrueOnPolicyContractSchema\n\n"
        "    @property\n    def name(self) -> str:\n        return self.schema.name\n\n"
        "    def policy_for(self, server_args: Any) -> SGLangTrueOnPolicyRuntimePolicy:\n"
        '        tp = getattr(server_args, "tp_size", 1) > 1\n'
        "        return SGLangTrueOnPolicyRuntimePolicy(\n"
        f"            contract_name=self.name,\n{v1}\n        )\n\n\n"
        "QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT = SGLangTrueOnPolicyContract(\n"
        "    schema=QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA,\n)"
        + _registry(
            "Unsupported SGLang true-on-policy contract",
            "contract_name",
            "SGLangTrueOnPolicyContract",
        )
        + textwrap.dedent("""

            def validate_true_on_policy_contract(server_args: Any) -> None:
                name = getattr(server_args, "true_on_policy_contract", None)
                if name is not None:
                    get_true_on_policy_contract(name)


            def resolve_true_on_policy_runtime_policy(server_args: Any) -> SGLangTrueOnPolicyRuntimePolicy:
                name = getattr(server_args, "true_on_policy_contract", None)
                if name is None:
                    return DEFAULT_RUNTIME_POLICY
                validate_true_on_policy_contract(server_args)
                return get_true_on_policy_contract(name).policy_for(server_args)
            """)
    )


MILES_CONTRACTS = textwrap.dedent("""\
    from __future__ import annotations

    from dataclasses import dataclass

    from .schema import (
        QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA,
        KernelContract,
        LogprobContract,
        ModelFamily,
        TrueOnPolicyContractName,
        TrueOnPolicyContractSchema,
    )


    @dataclass(frozen=True)
    class TrueOnPolicyContract:
        schema: TrueOnPolicyContractSchema

        @property
        def name(self) -> str:
            return self.schema.name

        @property
        def model_family(self) -> str:
            return self.schema.model_family

        @property
        def logprob_contract(self) -> str:
            return self.schema.logprob_contract

        @property
        def sglang_attention_backend(self) -> str:
            return self.schema.sglang_attention_backend

        def kernel_policy_kwargs_for(self, *, train_backend: str, sglang_target: str) -> dict:
            megatron = train_backend == "megatron"
            tp = sglang_target == "fsdp_tp"
            return {
                "deterministic_inference": True,
                "deterministic_training": True,
                "sglang_attention_backend": self.sglang_attention_backend,
                "megatron_uses_sglang_backend": megatron,
                "disable_rope_fusion": megatron,
                "disable_bias_swiglu_fusion": megatron,
                "batch_invariant_mode": megatron,
                "tp_invariant_row_linear": tp,
                "deterministic_tp_allreduce": tp,
            }


    QWEN3_DENSE_TRUE_ON_POLICY_V1 = TrueOnPolicyContract(schema=QWEN3_DENSE_TRUE_ON_POLICY_V1_SCHEMA)
    QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT = QWEN3_DENSE_TRUE_ON_POLICY_V1
""") + _registry("Unsupported true-on-policy contract", "name", "TrueOnPolicyContract")

# The repos' own tests (in the public repos' style), run before and after adopt.
OWN_TESTS = {
    "miles": textwrap.dedent(f"""\
        import pytest

        from miles.true_on_policy.config import launch_flags
        from miles.true_on_policy.contracts import get_true_on_policy_contract


        def test_v1_launch_flags():
            assert "--recompute-logprobs-via-prefill" in launch_flags("{V1}")


        def test_unknown_contract_is_refused():
            with pytest.raises(ValueError, match="Unsupported true-on-policy contract"):
                get_true_on_policy_contract(name="unknown_contract")


        @pytest.mark.parametrize("other", ["qwen3_dense_true_on_policy_v2", "qwen3_moe_true_on_policy_v1"])
        def test_other_contracts_are_refused(other):
            with pytest.raises(ValueError, match="Unsupported true-on-policy contract"):
                launch_flags(other)


        def test_kernel_kwargs():
            kwargs = get_true_on_policy_contract("{V1}").kernel_policy_kwargs_for(
                train_backend="megatron", sglang_target="fsdp_tp"
            )
            assert kwargs["tp_invariant_row_linear"] and kwargs["batch_invariant_mode"]
        """),
    "Megatron-LM": textwrap.dedent(f"""\
        from types import SimpleNamespace

        import pytest

        from miles_megatron_plugins.true_on_policy.contracts import (
            QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT,
            validate_true_on_policy_contract,
        )
        from miles_megatron_plugins.true_on_policy.norm import cast_before_weight


        def test_validate_by_keyword():
            validate_true_on_policy_contract(contract_name="{V1}")
            with pytest.raises(ValueError, match="Unsupported Megatron true-on-policy contract"):
                validate_true_on_policy_contract(contract_name="unknown_contract")


        @pytest.mark.parametrize(
            "other",
            ["qwen3_dense_true_on_policy_v2", "qwen3_moe_true_on_policy_v1", "llama3_dense_true_on_policy_v1"],
        )
        def test_layers_implement_dense_v1_only(other):
            with pytest.raises(ValueError, match="Unsupported Megatron true-on-policy contract"):
                validate_true_on_policy_contract(other)


        @pytest.mark.parametrize("comm", ["a2a", ["a2a"], ["a2a", "p2p"]])
        def test_ulysses_layout(comm):
            config = SimpleNamespace(context_parallel_size=2, cp_comm_type=comm)
            policy = QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT.policy_for(config)
            assert policy.cp_layout == "ulysses_a2a" and policy.use_ulysses_cp_recompute_fallback


        def test_norm():
            assert cast_before_weight(SimpleNamespace(true_on_policy_contract="{V1}")) is True
        """),
    "sglang": textwrap.dedent(f"""\
        from types import SimpleNamespace

        import pytest

        from sglang.srt.true_on_policy.config import should_use_tp_invariant_row_linear
        from sglang.srt.true_on_policy.contracts import (
            get_true_on_policy_contract,
            resolve_true_on_policy_runtime_policy,
        )


        @pytest.mark.parametrize(("k", "tp", "on"), [(4864, 2, True), (4864, 1, False), (100, 2, False)])
        def test_row_linear(k, tp, on):
            args = SimpleNamespace(true_on_policy_contract="{V1}", tp_size=tp)
            assert should_use_tp_invariant_row_linear(k, args) is on


        @pytest.mark.parametrize("other", ["qwen3_moe_true_on_policy_v1", "unknown_contract"])
        def test_refused(other):
            with pytest.raises(ValueError, match="Unsupported SGLang true-on-policy contract"):
                resolve_true_on_policy_runtime_policy(SimpleNamespace(true_on_policy_contract=other))
            with pytest.raises(ValueError, match="Unsupported SGLang true-on-policy contract"):
                get_true_on_policy_contract(contract_name=other)
        """),
}

# repo -> (target, package, import root, {path: text}); a bare name is inside the package
REPOS: dict[str, tuple[str, str, str, dict[str, str]]] = {
    "miles": (
        "launcher",
        "miles/true_on_policy",
        ".",
        {
            "miles/__init__.py": "",
            "miles/backends/__init__.py": "",
            "miles/backends/fsdp_utils/__init__.py": "",  # miles' FSDP backend: fsdp's anchor
            "./pyproject.toml": textwrap.dedent("""\
                [tool.black]
                line_length = 119

                [tool.isort]
                profile = "black"
                line_length = 119
                known_first_party = ["miles"]
                """),
            "tests/fast/true_on_policy/test_contract.py": OWN_TESTS["miles"],
            "__init__.py": (
                '"""Launch helpers."""\n\nfrom .config import launch_flags\n'
                "from .contracts import QWEN3_DENSE_TRUE_ON_POLICY_V1, get_true_on_policy_contract\n"
            ),
            "schema.py": SCHEMA,
            "contracts.py": MILES_CONTRACTS,
            "model_profiles.py": (
                "from .contracts import KernelContract, ModelFamily\n\n"
                'QWEN3_DENSE: ModelFamily = "qwen3_dense"\n'
                'KERNELS: tuple[KernelContract, ...] = ("qwen3_dense_sglang_math",)\n'
            ),
            "config.py": textwrap.dedent("""\
                from .contracts import get_true_on_policy_contract


                def launch_flags(name):
                    contract = get_true_on_policy_contract(name)
                    return ["--true-on-policy-contract", contract.name, "--recompute-logprobs-via-prefill"]
                """),
        },
    ),
    "Megatron-LM": (
        "megatron",
        "miles_megatron_plugins/true_on_policy",
        ".",
        {
            "megatron/__init__.py": "",
            "megatron/core/__init__.py": "",
            "miles_megatron_plugins/__init__.py": "",
            "./pyproject.toml": textwrap.dedent("""\
                [tool.black]
                line_length = 100
                skip_string_normalization = true
                skip_magic_trailing_comma = true

                [tool.isort]
                profile = "black"
                line_length = 100
                known_first_party = ["megatron", "miles_megatron_plugins"]
                """),
            "tests/unit_tests/test_true_on_policy_contract.py": OWN_TESTS["Megatron-LM"],
            "__init__.py": '"""True-on-policy backend components for Megatron Core."""\n',
            "schema.py": SCHEMA,
            "contracts.py": megatron_contracts(),
            **{
                f"{name}.py": (
                    "from .contracts import QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT\n\n"
                    f"{name.upper()} = QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT.name\n"
                )
                for name in ("provider", "layers", "matmul", "rope", "linear", "cp_layout")
            },
            "norm.py": textwrap.dedent("""\
                from .contracts import (
                    QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT,
                    validate_true_on_policy_contract,
                )


                def cast_before_weight(config):
                    validate_true_on_policy_contract(config.true_on_policy_contract)
                    policy = QWEN3_DENSE_TRUE_ON_POLICY_CONTRACT.policy_for(config)
                    return policy.cast_qk_norm_input_before_weight_mul
                """),
        },
    ),
    "sglang": (
        "sglang",
        "python/sglang/srt/true_on_policy",
        "python",
        {
            "python/sglang/__init__.py": "",
            "python/sglang/srt/__init__.py": "",
            "python/pyproject.toml": '[tool.ruff]\nline-length = 88\n\n[tool.isort]\nprofile = "black"\n',
            "test/srt/test_true_on_policy.py": OWN_TESTS["sglang"],
            "__init__.py": '"""True-on-policy runtime contract helpers."""\n\nfrom .config import ROW_LINEAR_INV_BLOCK_K\n',
            "schema.py": SCHEMA + SGLANG_MOE_SCHEMA,
            "contracts.py": sglang_contracts(),
            "config.py": textwrap.dedent("""\
                from sglang.srt.true_on_policy.contracts import resolve_true_on_policy_runtime_policy

                ROW_LINEAR_INV_BLOCK_K = 128


                def should_use_tp_invariant_row_linear(k_size, server_args):
                    policy = resolve_true_on_policy_runtime_policy(server_args)
                    return (
                        policy.tp_invariant_row_linear
                        and k_size >= ROW_LINEAR_INV_BLOCK_K
                        and k_size % ROW_LINEAR_INV_BLOCK_K == 0
                    )
                """),
        },
    ),
}


def git(path: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                   check=True, capture_output=True)  # fmt: skip


def make_repos(where: Path) -> dict[str, Path]:
    """The three repos, each one commit with its hand-kept package."""
    repos = {}
    for repo, (_, package, _, files) in REPOS.items():
        root = where / repo
        for rel, text in files.items():
            path = root / (rel if "/" in rel else f"{package}/{rel}")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        git(root, "add", "-A")
        git(root, "commit", "-qm", "hand-kept true_on_policy package")
        repos[repo] = root
    return repos


def own_tests(repo: str, root: Path) -> subprocess.CompletedProcess[str]:
    """Run the repo's own test file (as the repo would, its import root on the path)."""
    _, _, import_root, files = REPOS[repo]
    test = next(rel for rel in files if "/" in rel and rel.rsplit("/", 1)[-1].startswith("test_"))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
         "--rootdir", str(root), str(root / test)],
        cwd=root / import_root, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(root / import_root), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
