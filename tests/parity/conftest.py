"""Shared helpers for the parity gate tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

V1 = "qwen3_dense_true_on_policy_v1"
V2 = "qwen3_dense_true_on_policy_v2"


def run_parity(*args: str, tmp_path: Path, timeout: int = 900) -> tuple[int, dict | None, str]:
    """Run ``contractgen parity`` in a subprocess; (exit code, JSON report or None, stdout+stderr)."""
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "contractgen", "parity", "--quiet", "--json", str(report), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    data = json.loads(report.read_text()) if report.exists() else None
    return proc.returncode, data, proc.stdout + proc.stderr


def run_parity_in_process(*args: str, tmp_path: Path) -> tuple[int, dict | None, str]:
    """``run_parity`` without the process: for input the command refuses before any worker
    starts, where a fresh interpreter (torch and megatron-core imported again) is most of the
    cost. Output is stdout and stderr as a terminal shows them."""
    from click.testing import CliRunner

    from contractgen.cli import main

    report = tmp_path / "report.json"
    result = CliRunner().invoke(
        main,
        ["parity", "--quiet", "--json", str(report), *args],
        env={"PYTHONWARNINGS": "ignore"},  # what run_parity's process gets; restored after
    )
    data = json.loads(report.read_text()) if report.exists() else None
    out = result.output + (f"\n{result.exception!r}" if result.exception else "")
    return result.exit_code, data, out


@pytest.fixture(scope="session")
def reference_weights():
    """The v1 reference model's seeded random weights (what `parity` builds by default)."""
    from contractgen.adapters.sglang.model import ModelArch, random_weights
    from contractgen.codegen.vendored import load_target

    arch = ModelArch.from_profile(load_target("sglang").schema.model_profile_for(V1))
    return arch, random_weights(arch, seed=0)
