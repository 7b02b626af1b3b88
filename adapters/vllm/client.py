"""The main environment's side of the vLLM target: build a job, run ``runner.py`` in
``.venv-vllm`` as a subprocess, read the bits back (``rollout``: as the role's ``RolloutResult``).
Imports no vLLM (the main venv has none)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from safetensors.torch import load_file

from ..common.rollout import RolloutResult

REPO = Path(__file__).resolve().parents[2]
INSTALL_COMMAND = "bash tools/install-vllm.sh"
"""The one command that creates ``.venv-vllm`` (run in the repository root, about 4 minutes)."""


def vllm_python() -> Path:
    """``.venv-vllm``'s Python (``CONTRACTGEN_VLLM_PYTHON`` overrides it)."""
    env = os.environ.get("CONTRACTGEN_VLLM_PYTHON")
    return Path(env) if env else REPO / ".venv-vllm" / "bin" / "python"


def missing() -> str | None:
    """Why the vLLM target cannot run here (None: it can), with the command that fixes it."""
    py = vllm_python()
    if not py.exists():
        return f"no vLLM environment at {py}: run `{INSTALL_COMMAND}` in {REPO}"
    return None


def request_json(r) -> dict:
    """One ``common.rollout.Request`` as the runner's request."""
    return {
        "rid": r.rid,
        "prompt": list(r.prompt),
        "max_new_tokens": r.max_new_tokens,
        "temperature": r.temperature,
        "seed": r.seed,
        "arrival_step": r.arrival_step,
        "top_k": r.top_k,
        "top_p": r.top_p,
        "stop_token_ids": list(r.stop_token_ids),
    }


def make_job(
    checkpoint,
    arch,
    kp,
    runs: Sequence[tuple[str, Sequence]],
    *,
    engine: dict | None = None,
    updates: dict[int, str] | None = None,
) -> dict:
    """A runner job: ``runs`` are ``(name, engine Requests)``; ``engine`` adds ``LLM`` args."""
    return {
        "checkpoint": str(checkpoint),
        "arch": dataclasses.asdict(arch),
        "kernel_policy": dataclasses.asdict(kp),
        "engine": dict(engine or {}),
        "runs": [{"name": n, "requests": [request_json(r) for r in reqs]} for n, reqs in runs],
        "updates": {str(i): str(p) for i, p in (updates or {}).items()},
    }


class VllmRunError(RuntimeError):
    pass


def run(job: dict, workdir, *, timeout: float = 900.0) -> tuple[dict, dict]:
    """Run ``job`` in ``.venv-vllm``; ``(result.json, {key: tensor})`` (see ``runner.py``)."""
    if why := missing():
        raise VllmRunError(why)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    job_path, out = workdir / "job.json", workdir / "out"
    job_path.write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run(
        [str(vllm_python()), "-m", "contractgen.adapters.vllm.runner", str(job_path), str(out)],
        cwd=str(REPO),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    (workdir / "runner.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise VllmRunError(
            f"vllm runner exited {proc.returncode} (log: {workdir / 'runner.log'}):\n{tail}"
        )
    return json.loads((out / "result.json").read_text()), load_file(str(out / "result.safetensors"))


def rollout(
    checkpoint, arch, kp, requests: Sequence, workdir, *, engine: dict | None = None
) -> tuple[RolloutResult, dict]:
    """``requests`` generated and re-scored in vLLM on ``checkpoint`` under ``kp``: (the result as
    every rollout target reports one, the runner's metadata)."""
    job = make_job(checkpoint, arch, kp, [("gate", requests)], engine=engine)
    meta, out = run(job, Path(workdir) / "job")
    seqs, lens, dec, pre = [], [], [], []
    for r in requests:
        key = f"gate/{r.rid}"
        seqs.append([*r.prompt, *out[key + "/tokens"].tolist()])
        lens.append(len(r.prompt))
        dec.append(out[key + "/decode_lp"])
        pre.append(out[key + "/prefill_lp"])
    times = meta["runs"]["gate"]
    result = RolloutResult(
        seqs,
        lens,
        dec,
        pre,
        times["generate_s"],
        times["rescore_s"],
        sampling=[r.sampling for r in requests],
    )
    return result, meta


if __name__ == "__main__":  # pragma: no cover - a manual check
    print(missing() or f"ok: {vllm_python()}", file=sys.stderr)
