"""Llama 3 through the gate: exact at every default layout, an uncovered checkpoint refused with
exit 2, and a family that needs no code beyond its family module (the contract copied under a new
id into a temporary project runs). Llama 3 fault injection runs with the default contract's in
``test_faults.py::test_inject_faults_every_fault_detected_or_explained``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_parity

ROOT = Path(__file__).resolve().parents[2]
LLAMA = "llama3_dense_true_on_policy_v1"


@pytest.mark.slow
def test_llama3_gate_is_exact(tmp_path: Path) -> None:
    code, report, out = run_parity(
        "--contract", LLAMA, "--layouts", "tp1,tp2,pp2,cp2", tmp_path=tmp_path
    )
    assert code == 0, out
    assert [lay["name"] for lay in report["layouts"]] == ["tp1", "tp2", "pp2", "cp2"]
    assert all(lay["exact"] and lay["max_abs_diff"] == 0 for lay in report["layouts"]), out


def test_uncovered_checkpoint_exits_2_with_one_line(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    config = {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 300, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0, "tie_word_embeddings": False,
    }  # fmt: skip
    (ckpt / "config.json").write_text(json.dumps(config))
    code, report, out = run_parity(
        "--contract", LLAMA, "--checkpoint", str(ckpt), tmp_path=tmp_path
    )
    assert code == 2, out
    assert report is None and "Traceback" not in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert "not covered by the llama3_dense model profile" in line
    assert "contractgen add-checkpoint" in line


@pytest.mark.slow
def test_a_family_needs_no_code_beyond_its_module(tmp_path: Path) -> None:
    """The Llama contract under a new id, in a project of its own: generate and parity run with
    nothing but the contract file (the family is found by its module, not by any id)."""
    project = tmp_path / "project"
    (project / "contracts").mkdir(parents=True)
    new_id = "my_llama_dense_v1"
    text = (ROOT / "contracts" / f"{LLAMA}.yaml").read_text()
    (project / "contracts" / f"{new_id}.yaml").write_text(
        text.replace(f"id: {LLAMA}", f"id: {new_id}")
    )
    (project / "contractgen.toml").write_text("")
    cli = [sys.executable, "-m", "contractgen", "--root", str(project)]
    done = subprocess.run([*cli, "generate"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (project / "generated").is_dir()
    report = tmp_path / "report.json"
    done = subprocess.run(
        [*cli, "parity", "--contract", new_id, "--layouts", "tp1,tp2", "--rollout-tps", "1,2",
         "--quiet", "--no-reference", "--json", str(report)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(report.read_text())
    assert data["contract"] == new_id and all(lay["exact"] for lay in data["layouts"])
    shutil.rmtree(project)
