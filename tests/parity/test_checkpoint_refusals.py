"""`contractgen parity --checkpoint` on checkpoints it must not gate: every one exits 2 with one
line naming what to fix, before any worker starts, and writes no report.

Each case is the contract's reference model as ``save_pretrained`` writes it, with one thing
changed: a file broken or missing, a tensor missing, misshapen or extra, or a config field that
makes transformers compute another model than the contract's (a sliding window, an MLP bias,
another ``model_type``, a float layer count). Without these checks the first five ended in a
traceback and the others in a parity FAIL against transformers that named no cause.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from conftest import V1, reference_qwen3_config, run_parity, run_parity_in_process

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """V1's reference model, random weights, written by ``save_pretrained``."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt") / "qwen3"
    transformers.Qwen3ForCausalLM(reference_qwen3_config(V1)).save_pretrained(path)
    return path


def _copy(saved: Path, tmp_path: Path) -> Path:
    out = tmp_path / "ckpt"
    shutil.copytree(saved, out)
    return out


def _edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def _rewrite_weights(path: Path, edit) -> None:
    file = path / "model.safetensors"
    weights = safetensors_torch.load_file(str(file))
    edit(weights)
    safetensors_torch.save_file(weights, str(file), metadata={"format": "pt"})


def _shard_index(path: Path, weight_map) -> None:
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def _drop(name):
    return lambda w: w.pop(name)


def _add_bias(w):
    w["model.layers.0.mlp.down_proj.bias"] = torch.zeros(w["model.norm.weight"].shape)


def _narrow(w):
    w["model.layers.1.self_attn.o_proj.weight"] = w["model.layers.1.self_attn.o_proj.weight"][
        :, 1:
    ].clone()


CASES = {
    "no weight files": (
        lambda p: (p / "model.safetensors").unlink(), "no *.safetensors files"),
    "truncated file": (
        lambda p: (p / "model.safetensors").write_bytes((p / "model.safetensors").read_bytes()[:4096]),
        "model.safetensors: not a readable safetensors file"),
    "missing tensor": (
        lambda p: _rewrite_weights(p, _drop("model.layers.1.mlp.up_proj.weight")),
        "missing 1 tensor(s): model.layers.1.mlp.up_proj.weight"),
    "wrong shape": (
        lambda p: _rewrite_weights(p, _narrow),
        "wrong shape: model.layers.1.self_attn.o_proj.weight"),
    "extra bias": (
        lambda p: _rewrite_weights(p, _add_bias),
        "1 tensor(s) qwen3-tiny-random does not have: model.layers.0.mlp.down_proj.bias"),
    "index without weight_map": (
        lambda p: (p / "model.safetensors.index.json").write_text("{}"),
        "not a safetensors index"),
    "index naming a missing shard": (
        lambda p: _shard_index(p, {"model.norm.weight": "model-00002-of-00002.safetensors"}),
        "model-00002-of-00002.safetensors: missing (model.safetensors.index.json names it)"),
    "sliding window": (
        lambda p: _edit_config(p, use_sliding_window=True, sliding_window=32, max_window_layers=0,
                               layer_types=["sliding_attention"] * 4),
        "sliding-window attention in 4 layer(s)"),
    "mlp bias": (lambda p: _edit_config(p, mlp_bias=True), "mlp_bias=true"),
    "another model_type": (
        lambda p: _edit_config(p, model_type="llama"), "model_type 'llama' is not qwen3_dense's"),
    "float layer count": (
        lambda p: _edit_config(p, num_hidden_layers=4.0), "num_hidden_layers = 4.0 is not an integer"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_checkpoint_the_contract_cannot_gate_exits_2(saved, tmp_path, case):
    spoil, message = CASES[case]
    ckpt = _copy(saved, tmp_path)
    spoil(ckpt)
    code, report, out = run_parity_in_process("--checkpoint", str(ckpt), tmp_path=tmp_path)
    assert code == 2, out
    assert message in out, out
    assert "Traceback" not in out and report is None
    assert out.startswith("error: ") and out.count("error") == 1, out  # one line


def test_tied_config_with_its_own_lm_head(saved, tmp_path):
    """config.json ties the head, but the files carry a head of their own: transformers 5
    computes with that head, the contract with the embedding, so the weights are refused unless
    the two are equal (then the extra tensor is only a copy)."""
    from contractgen.adapters.common.checkpoint import CheckpointError, check_weight_files
    from contractgen.adapters.common.model import ModelArch
    from contractgen.codegen.vendored import load_target

    profile = load_target("sglang").schema.model_profile_for(V1)
    arch = ModelArch.from_profile(profile)
    assert not arch.tie_word_embeddings  # the file holds a head: as a tied model, one too many
    tied = dataclasses.replace(arch, tie_word_embeddings=True)
    ckpt = _copy(saved, tmp_path)
    check_weight_files(ckpt, arch)
    with pytest.raises(CheckpointError, match="differs from model.embed_tokens.weight"):
        check_weight_files(ckpt, tied)
    _rewrite_weights(
        ckpt, lambda w: w.update({"lm_head.weight": w["model.embed_tokens.weight"].clone()})
    )
    check_weight_files(ckpt, tied)


def test_config_transformers_cannot_load_exits_2(saved, tmp_path):
    """A config dialect the contract reads but transformers refuses (Qwen3 RoPE parameters keyed
    by layer type): exit 2 naming transformers' error and ``--no-reference``, not a traceback."""
    ckpt = _copy(saved, tmp_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg["rope_theta"]
    rope = {"rope_type": "default", "rope_theta": theta}
    _edit_config(ckpt, rope_parameters={"full_attention": rope, "sliding_attention": rope})
    code, report, out = run_parity(
        "--checkpoint", str(ckpt), "--layouts", "tp1", "--rollout-tps", "1", tmp_path=tmp_path
    )
    assert code == 2, out
    assert "cannot load" in out and "--no-reference skips that comparison" in out, out
    assert "Traceback" not in out and report is None


def test_rope_kinds_agree_with_the_kernels_and_the_schema():
    """What a checkpoint may name, what a contract may declare and what the kernels compute are
    one list, and a config naming another kind is refused."""
    import typing

    from contractgen.adapters.families import family_for
    from contractgen.adapters.families.hf_config import (
        ROPE_SCALING_TYPES,
        hf_config_fields,
        unsupported,
    )
    from contractgen.adapters.kernels.rope import ROPE_TYPES
    from contractgen.schema.models import RopeScaling

    schema = typing.get_args(RopeScaling.model_fields["type"].annotation)
    assert set(ROPE_SCALING_TYPES) == set(schema) == set(ROPE_TYPES) - {"default"}
    family = family_for("llama3_dense")
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
           "vocab_size": 100, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}  # fmt: skip
    assert not unsupported(family, hf_config_fields(family, {**cfg, "rope_scaling": None}))
    assert unsupported(family, hf_config_fields(family, cfg)) == [
        "rope scaling 'dynamic' is not supported (supported: linear, llama3, yarn)"
    ]
