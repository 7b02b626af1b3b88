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


def run_parity(
    *args: str, tmp_path: Path, fresh: bool = False, timeout: int | None = None
) -> tuple[int, dict | None, str]:
    """``contractgen parity --quiet --json``: (exit code, JSON report or None, stdout+stderr).

    In this process by default (``run_parity_in_process``): the worker's fork server, which has
    imported torch and megatron-core once, starts the run's ranks. A fresh interpreter cost each
    run about 6 s of CPU more (3.6 s against 9.9 s for the tiny tp1 gate, 2026-12-07), a minute
    or two of the suite's 30. ``fresh=True`` runs ``python -m contractgen`` in a subprocess
    (``timeout`` seconds, default 900; an in-process run has none to enforce, so it refuses
    one): for plants a ``sitecustomize`` on ``PYTHONPATH`` must bring into every process of the
    run, and for the entry point itself."""
    if not fresh:
        if timeout is not None:
            raise TypeError("run_parity: timeout= applies to fresh=True runs only")
        return run_parity_in_process(*args, tmp_path=tmp_path)
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "contractgen", "parity", "--quiet", "--json", str(report), *args],
        capture_output=True,
        text=True,
        timeout=900 if timeout is None else timeout,
        env=env,
    )
    data = json.loads(report.read_text()) if report.exists() else None
    return proc.returncode, data, proc.stdout + proc.stderr


def run_parity_in_process(*args: str, tmp_path: Path) -> tuple[int, dict | None, str]:
    """``contractgen parity --quiet --json`` in this process (click's runner). Output is stdout
    and stderr as a terminal shows them."""
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


def reference_qwen3_config(contract_id: str = V1):
    """transformers' ``Qwen3Config`` of the contract's reference model (for ``save_pretrained``)."""
    import transformers

    from contractgen.codegen.vendored import load_target

    profile = load_target("sglang").schema.model_profile_for(contract_id)
    dims = profile.reference_model
    return transformers.Qwen3Config(
        vocab_size=dims.vocab_size, hidden_size=dims.hidden_size,
        intermediate_size=dims.intermediate_size, num_hidden_layers=dims.num_layers,
        num_attention_heads=dims.num_attention_heads, num_key_value_heads=dims.num_kv_heads,
        head_dim=dims.head_dim, max_position_embeddings=dims.max_position_embeddings,
        rms_norm_eps=profile.norm_eps, rope_theta=profile.rope_theta,
        tie_word_embeddings=dims.tie_word_embeddings,
    )  # fmt: skip


@pytest.fixture(scope="session")
def reference_weights():
    """The v1 reference model's seeded random weights (what `parity` builds by default)."""
    from contractgen.adapters.sglang.model import ModelArch, random_weights
    from contractgen.codegen.vendored import load_target

    arch = ModelArch.from_profile(load_target("sglang").schema.model_profile_for(V1))
    return arch, random_weights(arch, seed=0)
