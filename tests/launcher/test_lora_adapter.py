"""``contractgen plan --lora-adapter DIR``: a PEFT adapter folder checked against the LoRA
contract and the model (exit 2, one line naming the field or tensor and the fix, nothing
written), and the SGLang serving flags of an adapter that fits (issue 34)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from contractgen.cli import main

ROOT = Path(__file__).resolve().parents[2]
QWEN = "qwen3_dense_lora_true_on_policy_v1"
V1 = "qwen3_dense_true_on_policy_v1"
A0 = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
DOWN_A0 = "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"
B3 = "base_model.model.model.layers.3.mlp.down_proj.lora_B.weight"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped contracts with every side implementing the LoRA contract (and dense v1)."""
    root = tmp_path_factory.mktemp("lora-project")
    shutil.copytree(ROOT / "contracts", root / "contracts")
    ids = json.dumps([V1, QWEN])
    (root / "contractgen.toml").write_text(
        "".join(f"[targets.{t}]\ncontracts = {ids}\n" for t in ("sglang", "megatron", "launcher"))
    )
    return root


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An adapter of the reference model written by ``export_peft`` (r=8, alpha=16)."""
    from contractgen.adapters.common.lora import export_peft, random_adapter
    from contractgen.codegen.vendored import load_target
    from contractgen.parity.targets import rollout_adapter

    schema = load_target("sglang").schema
    arch = rollout_adapter().ModelArch.from_profile(schema.model_profile_for(QWEN))
    modules = tuple(schema.CONTRACT_DATA[QWEN]["lora"]["target_modules"])
    out = tmp_path_factory.mktemp("exported") / "policy-step0"
    export_peft(random_adapter(arch, modules, 8, 16.0), out, base_model=f"me/{arch.name}")
    return out


def _plan(project: Path, adapter: Path, *extra: str, contract: str = QWEN):
    args = ["--root", str(project), "plan", "--contract", contract, "--model", "reference"]
    return CliRunner().invoke(
        main, [*args, "--lora-adapter", str(adapter), *extra], env={"NCCL_ALGO": None}
    )


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_exported_adapter_round_trips_into_serving_flags(project: Path, exported: Path) -> None:
    """export_peft -> plan --lora-adapter accepts it; the rollout command serves that folder at
    its rank, unmerged, one adapter per batch, strict loading; the JSON carries the same."""
    text = _plan(project, exported)
    assert text.exit_code == 0, text.stderr
    path = str(exported.resolve())
    flags = (
        f"--enable-lora --lora-paths policy-step0={path} --max-lora-rank 8 "
        "--lora-target-modules down_proj gate_proj k_proj o_proj q_proj up_proj v_proj "
        "--max-loras-per-batch 1 --lora-backend torch_native --lora-strict-loading"
    )
    rollout = [line for line in text.stdout.splitlines() if "sglang.launch_server" in line]
    assert len(rollout) == 1 and rollout[0].endswith(flags)
    assert f"LoRA adapter {path} (r=8, alpha=16, 56 tensors" in text.stdout
    data = json.loads(_plan(project, exported, "--format", "json").stdout)
    assert data["lora"]["rank"] == 8 and data["lora"]["alpha"] == 16.0
    assert data["lora"]["path"] == path and data["lora"]["tensors"] == 56
    assert (
        data["commands"]["rollout"][-len(data["lora"]["sglang_args"]) :]
        == (data["lora"]["sglang_args"])
    )
    shell = _plan(project, exported, "--format", "shell").stdout
    assert f"--lora-paths policy-step0={path} --max-lora-rank 8" in shell
    # without the option the plan has no LoRA flags at all
    plain = CliRunner().invoke(
        main, ["--root", str(project), "plan", "--contract", QWEN, "--model", "reference"]
    )
    assert plain.exit_code == 0 and "--enable-lora" not in plain.stdout


@pytest.mark.slow  # a subprocess importing sglang (~6 s)
def test_serving_flags_parse_with_the_real_sglang_parser(
    project: Path, exported: Path, sglang_probe: Callable[..., dict[str, Any]]
) -> None:
    """The flags are SGLang's own (the pinned release's parser takes them, values intact)."""
    from contractgen.adapters.launcher.lora_adapter import LoraServing

    data = json.loads(_plan(project, exported, "--format", "json").stdout)
    args = data["lora"]["sglang_args"]
    probed = sglang_probe([["--model-path", "x", *args]], [a for a in args if a[:2] == "--"])
    assert all(info["known"] for info in probed["flags"].values()), probed["flags"]
    parsed = probed["parsed"][0]
    assert parsed.get("unknown") == [], parsed
    got = parsed["set"]
    assert got["enable_lora"] is True and got["max_lora_rank"] == 8
    assert got["max_loras_per_batch"] == 1 and got["lora_strict_loading"] is True
    assert str(exported.resolve()) in json.dumps(got["lora_paths"])
    assert sorted(got["lora_target_modules"]) == sorted(data["lora"]["target_modules"])
    assert LoraServing.__dataclass_fields__  # the type the plan carries


def _config_edit(**changes: Any) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        path = folder / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))

    return edit


def _tensor_edit(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        from safetensors.torch import load_file, save_file

        path = folder / "adapter_model.safetensors"
        tensors = load_file(path)
        change(tensors)
        save_file(tensors, path)

    return edit


def _reshape(tensors: dict) -> None:
    tensors[B3] = tensors[B3][:, :4].contiguous()


def _extra(tensors: dict) -> None:
    tensors["base_model.model.lm_head.lora_A.weight"] = tensors[A0].clone()


# (case, edit, the start of the one stderr line after "error: <where>: ")
REFUSALS = {
    "base_model": (_config_edit(base_model_name_or_path="Qwen/Qwen3-0.6B"),
                   "base_model_name_or_path = 'Qwen/Qwen3-0.6B': the adapter must be trained on "
                   "qwen3-tiny-random"),
    "dora": (_config_edit(use_dora=True), "use_dora = True: DoRA"),
    "dropout": (_config_edit(lora_dropout=0.05), "lora_dropout = 0.05: " + QWEN),
    "merged": (_config_edit(merge_weights=True), "merge_weights = True: merged weights"),
    "rslora": (_config_edit(use_rslora=True), "use_rslora = True: rsLoRA"),
    "bias": (_config_edit(bias="all"), "bias = 'all': LoRA biases"),
    "rank_pattern": (_config_edit(rank_pattern={"q_proj": 4}), "rank_pattern = {'q_proj': 4}"),
    "rank_over_max": (_config_edit(r=65), f"r = 65: {QWEN} admits ranks 1..64"),
    "rank_zero": (_config_edit(r=0), f"r = 0: {QWEN} admits ranks 1..64"),
    "alpha_zero": (_config_edit(lora_alpha=0), "lora_alpha = 0: "),
    "alpha_over_max": (_config_edit(lora_alpha=2048), "lora_alpha = 2048: "),
    "unknown_module": (_config_edit(target_modules=["q_proj", "lm_head"]),
                       "target_modules: 'lm_head' is not a linear of qwen3_dense"),
    "config_rank_vs_tensors": (_config_edit(r=4), f"{DOWN_A0}: shape [8, 1536], expected [4, 1536]"),
    "tensor_shape": (_tensor_edit(_reshape), f"{B3}: shape [256, 4], expected [256, 8]"),
    "missing_tensor": (_tensor_edit(lambda t: t.pop(B3)), f"missing {B3}"),
    "extra_tensor": (_tensor_edit(_extra), "base_model.model.lm_head.lora_A.weight: not an adapter"),
    "no_weights": (lambda f: (f / "adapter_model.safetensors").unlink(),
                   "no adapter_model.safetensors"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_bad_adapter_exits_2_with_one_line_and_writes_nothing(
    case: str, project: Path, exported: Path, tmp_path: Path
) -> None:
    edit, expected = REFUSALS[case]
    folder = tmp_path / "adapter"
    shutil.copytree(exported, folder)
    edit(folder)
    before = _snapshot(folder)
    result = _plan(project, folder)
    assert result.exit_code == 2, result.stdout
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert expected in lines[0], lines[0]
    assert _snapshot(folder) == before  # nothing written


def test_adapter_on_a_contract_without_lora_exits_2(project: Path, exported: Path) -> None:
    result = _plan(project, exported, contract=V1)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip() == (
        f"error: --lora-adapter: {V1} has no lora section; use a LoRA contract "
        "(e.g. qwen3_dense_lora_true_on_policy_v1)"
    )
