"""Issue 12: ``parity`` honours ``--contracts``; ``--json -`` leaves stdout to the JSON alone; the
gate's output carries no third-party import warnings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import V1

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"


@pytest.mark.slow
def test_parity_reads_given_contracts_and_json_to_stdout_is_json_only(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    text = (CONTRACTS / f"{V1}.yaml").read_text().replace(f"id: {V1}", "id: mine_v1")
    (folder / "mine_v1.yaml").write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    proc = subprocess.run(
        [sys.executable, "-m", "contractgen", "--contracts", str(folder), "parity",
         "--contract", "mine_v1", "--layouts", "tp1", "--rollout-tps", "1", "--no-reference",
         "--quiet", "--json", "-"],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # the whole of stdout is the report
    assert report["contract"] == "mine_v1"
    assert "result    PASS" in proc.stderr  # the table went to stderr
    assert "Apex" not in proc.stderr and "Transformer Engine" not in proc.stderr


def test_parity_unknown_contract_in_given_folder_exits_2(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    text = (CONTRACTS / f"{V1}.yaml").read_text().replace(f"id: {V1}", "id: mine_v1")
    (folder / "mine_v1.yaml").write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "contractgen", "--contracts", str(folder), "parity",
         "--contract", "mine_v1", "--layouts", "tp3"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "unknown" not in proc.stderr.lower() or "layout" in proc.stderr.lower(), proc.stderr


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"hidden_size": 1000}, "not covered by the qwen3_dense model profile"),
        (None, "not a JSON config"),
        ({"hidden_size": None, "drop": "vocab_size"}, "has no 'vocab_size'"),
    ],
)
def test_checkpoint_the_profile_does_not_cover_is_one_line_exit_2(
    tmp_path: Path, config, expected: str
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    base = {
        "architectures": ["Qwen3ForCausalLM"], "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True,
        "max_position_embeddings": 40960,
    }  # fmt: skip
    if config is None:
        (ckpt / "config.json").write_text("{not json")
    else:
        if config.get("hidden_size"):
            base["hidden_size"] = config["hidden_size"]
        base.pop(config.get("drop", ""), None)
        (ckpt / "config.json").write_text(json.dumps(base))
    proc = subprocess.run(
        [sys.executable, "-m", "contractgen", "parity", "--checkpoint", str(ckpt), "--layouts", "tp1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
