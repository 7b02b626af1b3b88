"""The vLLM target's tests: real vLLM in ``.venv-vllm``, reached by subprocess (``adapters/vllm/
runner.py``), its bits compared here with the reference rollout engine's.

Without ``.venv-vllm`` the tests skip locally and FAIL on CI (``CI=true``), each naming the one
command that installs it: CI must never pass without having run them.
"""

from __future__ import annotations

import os

import pytest

CONTRACT = "qwen3_dense_true_on_policy_v1"


def require_vllm() -> None:
    from contractgen.adapters.vllm.client import missing

    why = missing()
    if why is None:
        return
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"CI must run the vLLM tests: {why}", pytrace=False)
    pytest.skip(why)


def reference_case(tmp_path_factory, contract: str):
    """The contract's reference model written as a float32 checkpoint folder (config.json +
    safetensors, what vLLM reads), its arch, the kernel policy and a ``make_engine(kp)`` for the
    reference engine (TP=1) on the same weights."""
    from contractgen.adapters.sglang.engine import RolloutEngine
    from contractgen.adapters.sglang.model import ReferenceModel
    from contractgen.adapters.sglang.session import model_arch, policies
    from contractgen.parity.random_model import write_random_checkpoint

    base = tmp_path_factory.mktemp("vllm_ckpt")
    _, kp, rp = policies(contract, 1, None, {}, {})
    name = model_arch(contract, {})[0].name
    ckpt, _ = write_random_checkpoint(contract, name, base / "model", init="contractgen", dtype="float32")  # fmt: skip
    arch, weights = model_arch(contract, str(ckpt))

    def make_engine(policy=kp):
        return RolloutEngine(ReferenceModel(arch, weights, policy, rp), progress=False)

    return ckpt, arch, kp, make_engine


def reference_rollout(engine, requests):
    """``rid -> (tokens, decode logprobs, prefill re-score logprobs of the response)``."""
    done = engine.generate(requests)
    seqs = [done[r.rid].sequence for r in requests]
    scored = engine.rescore_many(seqs, [r.sampling for r in requests])
    return {
        r.rid: (
            done[r.rid].tokens,
            done[r.rid].logprob_tensor(),
            scored[i][len(r.prompt) - 1 :],
        )
        for i, r in enumerate(requests)
    }


def run_once(job: dict, tmp_path_factory):
    """``client.run(job)`` once per session whatever the number of xdist workers: the first
    worker to ask runs the engine under a file lock, the others read its files (``--dist
    worksteal`` may split one module's tests over both workers)."""
    import fcntl
    import hashlib
    import json

    from contractgen.adapters.vllm import client

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the workers of this session
    # the checkpoint's path is each worker's own; its contents are the same (seeded)
    same = {k: v for k, v in job.items() if k != "checkpoint"}
    key = hashlib.sha256(json.dumps(same, sort_keys=True).encode()).hexdigest()[:16]
    workdir = root / f"vllm-job-{key}"
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (workdir / "out" / "result.json").exists():
            from safetensors.torch import load_file

            meta = json.loads((workdir / "out" / "result.json").read_text())
            return meta, load_file(str(workdir / "out" / "result.safetensors"))
        return client.run(job, workdir)
