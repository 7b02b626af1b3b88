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
         "--contract", "mine_v1", "--layouts", "tp1", "--quiet", "--json", "-"],
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
