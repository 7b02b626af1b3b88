"""``contractgen parity --lora-adapter DIR``: a PEFT folder (from ``export_peft``) served by the
gate instead of a random adapter, checked as ``plan --lora-adapter`` checks it (issue 34)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from contractgen.cli import main

QWEN = "qwen3_dense_lora_true_on_policy_v1"


@pytest.fixture(scope="module")
def adapter_and_folder(tmp_path_factory):
    from contractgen.adapters.common.lora import export_peft, random_adapter
    from contractgen.codegen.vendored import load_target
    from contractgen.parity.targets import rollout_adapter

    schema = load_target("sglang").schema
    arch = rollout_adapter().ModelArch.from_profile(schema.model_profile_for(QWEN))
    modules = tuple(schema.CONTRACT_DATA[QWEN]["lora"]["target_modules"])
    adapter = random_adapter(arch, modules, 8, 12.0, seed=5)
    folder = tmp_path_factory.mktemp("parity-adapter") / "a"
    export_peft(adapter, folder, base_model=arch.name)
    return adapter, folder


def test_adapter_folder_loads_bitwise_as_the_gate_serves_it(adapter_and_folder) -> None:
    """The folder's tensors come back under the gate's names, bit for bit, with alpha from the
    config; the base weights are untouched."""
    from contractgen.codegen.vendored import load_target
    from contractgen.commands.parity import _with_adapter_dir

    adapter, folder = adapter_and_folder
    base = {"model.embed_tokens.weight": torch.ones(2, 2)}
    got = _with_adapter_dir(QWEN, load_target("sglang").schema, dict(base), folder)
    assert set(got) == set(adapter) | set(base)
    assert all(torch.equal(got[k], v) and got[k].dtype == v.dtype for k, v in adapter.items())
    assert torch.equal(got["model.embed_tokens.weight"], base["model.embed_tokens.weight"])


def test_parity_refuses_a_bad_adapter_folder_in_one_line(adapter_and_folder, tmp_path) -> None:
    import shutil

    _, folder = adapter_and_folder
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    config = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    result = CliRunner().invoke(main, ["parity", "--contract", QWEN, "--lora-adapter", str(bad)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "use_dora = True" in lines[0]
    both = CliRunner().invoke(
        main, ["parity", "--contract", QWEN, "--lora", "8", "--lora-adapter", str(folder)]
    )
    assert both.exit_code == 2
    assert both.output.strip() == (
        "error: --lora and --lora-adapter both give an adapter; pass one of them"
    )


def test_a_model_checkpoint_carries_the_random_adapter_to_every_reader(tmp_path) -> None:
    """``--model NAME --lora R``: the scratch checkpoint gets ``lora_adapter.safetensors``; the
    engines' reader loads it with the base weights (the weight-file check admits it) and the
    transformers reference wraps the model with peft for it. A --checkpoint folder of the user's
    is never written into (exit 2)."""
    from peft import PeftModel

    from contractgen.adapters.common.checkpoint import check_weight_files
    from contractgen.adapters.common.lora import CHECKPOINT_ADAPTER_FILE, split_adapter
    from contractgen.adapters.sglang.session import model_arch
    from contractgen.codegen.vendored import load_target
    from contractgen.commands.parity import _with_lora
    from contractgen.parity.random_model import write_random_checkpoint
    from contractgen.parity.reference import hf_model

    schema = load_target("sglang").schema
    path, _ = write_random_checkpoint(QWEN, "reference", tmp_path / "ckpt")
    before = sorted(p.name for p in path.iterdir())
    assert _with_lora(QWEN, schema, str(path), "8,12", scratch=object()) == str(path)
    assert sorted(p.name for p in path.iterdir()) == sorted([*before, CHECKPOINT_ADAPTER_FILE])
    arch, weights = model_arch(QWEN, str(path))
    check_weight_files(path, arch)
    base, adapter = split_adapter(weights)
    assert len(adapter) == 4 * 7 * 2 + 1 and float(adapter["lora.alpha"]) == 12.0
    assert isinstance(hf_model(str(path), schema.model_profile_for(QWEN), torch.float32), PeftModel)
    user = tmp_path / "user"
    write_random_checkpoint(QWEN, "reference", user)
    result = CliRunner().invoke(
        main, ["parity", "--contract", QWEN, "--checkpoint", str(user), "--lora", "8"]
    )
    assert result.exit_code == 2 and "is not written into" in result.output
    assert not (user / CHECKPOINT_ADAPTER_FILE).exists()


def test_the_grad_check_report_says_it_compares_the_adapter(tmp_path) -> None:
    from types import SimpleNamespace

    from contractgen.adapters.common.lora import CHECKPOINT_ADAPTER_FILE, LORA_ALPHA_KEY
    from contractgen.parity.training import _GradCheck

    def dtype(weights) -> str:
        run = SimpleNamespace(config=SimpleNamespace(weights=weights))
        return _GradCheck(run, note=None).report([])["dtype"]

    with_adapter = {"w": torch.ones(1), LORA_ALPHA_KEY: torch.tensor(1.0, dtype=torch.float64)}
    assert dtype({"w": torch.ones(1)}) == "float32 trainer vs float64 transformers autograd"
    assert dtype(with_adapter).endswith("(peft: the adapter's A and B; the base is frozen)")
    assert "peft" not in dtype(str(tmp_path))
    (tmp_path / CHECKPOINT_ADAPTER_FILE).write_bytes(b"")
    assert "peft" in dtype(str(tmp_path))
