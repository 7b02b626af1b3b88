"""``contractgen add-checkpoint``: HF configs (every RoPE dialect) become checkpoint entries,
written into the contract file as text (comments kept), validated, non-breaking; configs the
family cannot run are refused with exit 2 and nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from breaking_support import cli, commit, git

from contractgen.schema.loader import parse_contract

ROOT = Path(__file__).resolve().parents[2]
LLAMA = "llama3_dense_true_on_policy_v1"
FILE = f"contracts/{LLAMA}.yaml"
LLAMA31_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
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
    """A Llama config.json as transformers 4.x writes it (rope_theta + rope_scaling)."""
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "attention_bias": False,
        **over,
    }
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def test_adds_entries_as_text_and_is_not_breaking(tmp_path: Path) -> None:
    root = _project(tmp_path)
    before = (root / FILE).read_text()
    # transformers 5.x dialect (rope_parameters with rope_type), llama3 scaling, tied head
    v5 = _config(
        tmp_path, "Llama-3.2-1B-like",
        num_hidden_layers=16, intermediate_size=8192, num_key_value_heads=8, head_dim=64,
        tie_word_embeddings=True, vocab_size=128256, rope_scaling=None, rope_theta=None,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA31_SCALING},
    )  # fmt: skip
    # 4.x dialect with the legacy `type` key; 22 layers: PP=4 is ruled out, so pp_sizes is written
    v4 = _config(tmp_path, "tiny-llama", rope_scaling={"type": "llama3", **LLAMA31_SCALING})
    code, out, err = cli(root, "add-checkpoint", LLAMA, str(v5), str(v4))
    assert code == 0, err
    assert "added Llama-3.2-1B-like, tiny-llama" in out
    after = (root / FILE).read_text()
    old, new = before.splitlines(), after.splitlines()
    head = next(i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b)
    assert new[len(new) - (len(old) - head) :] == old[head:]  # one block inserted, nothing else
    assert old[head - 1].endswith("original_max_position_embeddings: 8192}}}")  # after the last
    contract = parse_contract(after.encode(), FILE)
    new = {d.name: d for d in contract.model_profile.checkpoints[-2:]}
    one, tiny = new["Llama-3.2-1B-like"], new["tiny-llama"]
    assert one.tie_word_embeddings and one.head_dim == 64 and one.pp_sizes is None
    assert one.rope.scaling.type == "llama3" and one.rope.scaling.factor == 8.0
    assert tiny.head_dim == 64 and tiny.pp_sizes == (1, 2) and tiny.num_kv_heads == 4
    assert tiny.rope.scaling.original_max_position_embeddings == 8192
    assert cli(root, "generate")[0] == 0
    code, out, err = cli(root, "breaking", "--against", "HEAD", "-v")
    assert code == 0, out + err
    assert "CHECKPOINT_ADDED" in out


def test_tp_sizes_computed_or_given(tmp_path: Path) -> None:
    root = _project(tmp_path)
    # down_proj K=9728 = 76 tiles: 9.5 per rank at TP=8, so only TP 1, 2, 4 split exactly
    odd = _config(tmp_path, "odd", intermediate_size=9728, num_key_value_heads=8)
    assert cli(root, "add-checkpoint", LLAMA, str(odd))[0] == 0
    dims = parse_contract((root / FILE).read_bytes(), FILE).model_profile.checkpoints[-1]
    assert dims.tp_sizes == (1, 2, 4) and dims.rope is None  # the profile's RoPE: not repeated
    plain = _config(tmp_path, "plain", num_key_value_heads=8)
    code, _, err = cli(
        root, "add-checkpoint", LLAMA, str(plain), "--name", "P", "--tp-sizes", "1,2"
    )
    assert code == 0, err
    dims = parse_contract((root / FILE).read_bytes(), FILE).model_profile.checkpoints[-1]
    assert (dims.name, dims.tp_sizes) == ("P", (1, 2))


def test_refusals_exit_2_and_write_nothing(tmp_path: Path) -> None:
    root = _project(tmp_path)
    before = (root / FILE).read_bytes()
    cases = {
        "qwen": ({"architectures": ["Qwen3ForCausalLM"]}, "is not llama3_dense's"),
        "bias": ({"attention_bias": True}, "llama3_dense has no attention bias"),
        "eps": ({"rms_norm_eps": 1e-6}, "norm_eps=1e-06 (the profile's: 1e-05)"),
        "gelu": ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        "rope": ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0, "short_factor": [1]}},
                 "parameters ['short_factor'] are not supported"),
    }  # fmt: skip
    for name, (over, message) in cases.items():
        code, _, err = cli(root, "add-checkpoint", LLAMA, str(_config(tmp_path, name, **over)))
        assert code == 2 and message in err, (name, err)
        assert len(err.strip().splitlines()) == 1, err
    ok = _config(tmp_path, "ok", num_key_value_heads=8)
    assert cli(root, "add-checkpoint", LLAMA, str(ok), "--name", "Meta-Llama-3-8B")[0] == 2
    assert cli(root, "add-checkpoint", "nope_v1", str(ok))[0] == 2
    assert (root / FILE).read_bytes() == before


def test_fixed_runs_refuses_a_checkpoint_whose_k_is_not_whole_runs(tmp_path: Path) -> None:
    """Under fixed_runs (llama3 v2) every matmul's K, the column-parallel ones and the LM head's
    included, is 8 runs of whole 64-wide tiles at TP=1 already: hidden 1600 (25 heads of 64) fits
    no TP. Exit 2, one line naming the weight and the runs, nothing written; the same config at
    hidden 2048 is added."""
    root = _project(tmp_path)
    v2 = "contracts/llama3_dense_true_on_policy_v2.yaml"
    shutil.copy(ROOT / v2, root / v2)
    commit(root, "v2")
    before = (root / v2).read_bytes()
    odd = _config(tmp_path, "odd", hidden_size=1600, num_attention_heads=25,
                  num_key_value_heads=5, intermediate_size=4096)  # fmt: skip
    code, _, err = cli(root, "add-checkpoint", "llama3_dense_true_on_policy_v2", str(odd))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "q: K=1600 does not split into 8 runs of whole 64-wide tiles" in err, err
    assert "no tp_sizes helps" in err, err
    assert (root / v2).read_bytes() == before
    fits = _config(tmp_path, "fits", num_key_value_heads=8)
    code, _, err = cli(root, "add-checkpoint", "llama3_dense_true_on_policy_v2", str(fits))
    assert code == 0, err
