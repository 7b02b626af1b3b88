"""``contractgen add-checkpoint`` on Qwen3-MoE ``config.json`` files: the MoE dims come through
the family module (``num_experts`` or transformers 5's ``num_local_experts``), the TP sizes are
computed from the expert down_proj K as well, and the result reproduces the contract's own
Qwen3-30B-A3B entry (whose values are the public config.json's)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from breaking_support import cli, commit, git

from contractgen.schema.loader import parse_contract

ROOT = Path(__file__).resolve().parents[2]
MOE = "qwen3_moe_true_on_policy_v1"
FILE = f"contracts/{MOE}.yaml"

# Qwen/Qwen3-30B-A3B config.json (transformers 4.51.0), the keys the contract reads
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
}


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "contracts").mkdir(parents=True)
    shutil.copy(ROOT / FILE, root / FILE)
    (root / "contractgen.toml").write_text("")
    git(root, "-c", "init.defaultBranch=main", "init", "-q")
    commit(root, "base")
    return root


def _config(tmp_path: Path, name: str, **over) -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps({**QWEN3_30B_A3B, **over}))
    return path


def test_moe_config_reproduces_the_contract_entry(tmp_path: Path) -> None:
    root = _project(tmp_path)
    code, out, err = cli(
        root, "add-checkpoint", MOE, str(_config(tmp_path, "a3b")), "--name", "A3B-copy"
    )
    assert code == 0, err
    profile = parse_contract((root / FILE).read_bytes(), FILE).model_profile
    ours = {d.name: d for d in profile.checkpoints}
    added, shipped = ours["A3B-copy"], ours["Qwen3-30B-A3B"]
    assert added.model_dump(exclude={"name"}) == shipped.model_dump(exclude={"name"})
    # expert down_proj K=768 is 6 tiles: TP=4 would give each rank 1.5; 4 KV heads rule out 8
    assert added.tp_sizes == (1, 2) and added.num_experts == 128 and added.mlp_only_layers == ()
    assert cli(root, "generate")[0] == 0
    code, out, err = cli(root, "breaking", "--against", "HEAD", "-v")
    assert code == 0 and "CHECKPOINT_ADDED" in out, out + err


def test_transformers5_spelling_and_defaults(tmp_path: Path) -> None:
    """transformers 5 saves num_experts as num_local_experts; omitted keys take Qwen3MoeConfig's
    defaults (norm_topk_prob false, decoder_sparse_step 1, no mlp_only_layers)."""
    root = _project(tmp_path)
    cfg = {k: v for k, v in QWEN3_30B_A3B.items() if k not in ("num_experts", "norm_topk_prob")}
    del cfg["decoder_sparse_step"], cfg["mlp_only_layers"]
    path = tmp_path / "v5"
    path.mkdir()
    (path / "config.json").write_text(
        json.dumps({**cfg, "num_local_experts": 64, "moe_intermediate_size": 1024})
    )
    code, _, err = cli(root, "add-checkpoint", MOE, str(path))
    assert code == 0, err
    dims = parse_contract((root / FILE).read_bytes(), FILE).model_profile.checkpoints[-1]
    assert (dims.num_experts, dims.norm_topk_prob, dims.decoder_sparse_step) == (64, False, 1)
    assert dims.mlp_only_layers == () and dims.tp_sizes == (1, 2, 4)  # 1024 = 8 tiles


def test_moe_refusals_exit_2(tmp_path: Path) -> None:
    root = _project(tmp_path)
    before = (root / FILE).read_bytes()
    dense = _config(tmp_path, "dense", architectures=["Qwen3ForCausalLM"])
    code, _, err = cli(root, "add-checkpoint", MOE, str(dense))
    assert code == 2 and "is not qwen3_moe's" in err
    topk = _config(tmp_path, "topk", num_experts_per_tok=200)
    code, _, err = cli(root, "add-checkpoint", MOE, str(topk))
    assert code == 2 and "num_experts_per_tok 200 exceeds num_experts 128" in err
    assert (root / FILE).read_bytes() == before
