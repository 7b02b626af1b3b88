"""Run a rollout inside real vLLM and write its bits to files (run with ``.venv-vllm``'s Python).

    .venv-vllm/bin/python -m contractgen.adapters.vllm.runner JOB.json OUT_DIR

vLLM lives in its own venv (its pins: ``tools/install-vllm.sh``), so the parity gate and the test
suite call this module as a subprocess. One engine serves every run of the job (engine start is
5-8 s). The file protocol:

- ``JOB.json``: ``checkpoint`` (a folder with ``config.json`` and safetensors), ``arch`` and
  ``kernel_policy`` (resolved by the caller: the model reads nothing else), ``engine`` (``LLM``
  arguments: ``max_num_batched_tokens`` …), ``runs``: ``[{"name", "requests": [{"rid",
  "prompt", "max_new_tokens", "temperature", "seed", "arrival_step", "top_k", "top_p",
  "stop_token_ids"}], "rescore": true}]``, optional ``updates``: before run ``i``, the weights in
  ``updates[i]`` (a safetensors file of HF-named tensors) are pushed into the running engine in
  place (``collective_rpc`` + ``reset_prefix_cache``); optional ``plant_stock`` (``"rms_norm"``:
  vLLM's own RMSNorm as the final norm, the strict check's self-test).
- ``OUT_DIR/result.safetensors``: per run and request ``{run}/{rid}/tokens`` (int64, the new
  tokens), ``{run}/{rid}/decode_lp`` (the sampler's logprobs) and ``{run}/{rid}/prefill_lp`` (the
  re-score of the finished sequence, response positions), both in the contract's
  ``logsoftmax_dtype``: the exact bits, never decimal text.
- ``OUT_DIR/result.json``: timings, vLLM's version, the contract ops' call counts.

Requests join at their ``arrival_step`` (an engine step: chunked prefill makes a prompt take
several), each with its contract params in ``extra_args``; the re-score of a run's finished
sequences is one batch of prompt-logprob requests (``prompt_logprobs=0``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# what the engine needs on this machine (VLLM_CPU.md); set before vllm is imported (every vllm
# import here is in a function, after ``_setenv``)
ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine in this process: collective_rpc reaches it
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # cores shared with other jobs
    "VLLM_CPU_ATTN_SPLIT_KV": "0",  # stock CPU attention's split-KV (not on our path; pinned off)
    "VLLM_PLUGINS": "contractgen",  # only this project's general plugin
}

# LLM arguments every contract run takes (the generated runtime policy adds the contract's own)
LLM_ARGS = {
    "enforce_eager": True,
    "skip_tokenizer_init": True,
    "enable_chunked_prefill": True,
    "async_scheduling": False,  # the sampler reads each request's draw count from its state
    "enable_prefix_caching": False,
    "tensor_parallel_size": 1,
    "seed": 0,
}


def _setenv() -> None:
    for k, v in ENV.items():
        os.environ.setdefault(k, v)


def build_llm(job: dict):
    """The engine for ``job``: the contract's model class selected by ``hf_overrides``, the
    contract sampler installed."""
    _setenv()
    import vllm  # optional: vllm

    from .plugin import ARCHITECTURES  # optional: vllm
    from .sampler import install  # optional: vllm

    arch, kp = job["arch"], job["kernel_policy"]
    family = arch["family"]
    if family not in ARCHITECTURES:
        raise SystemExit(
            f"vllm runner: family {family!r} has no vLLM model here (built: "
            f"{', '.join(ARCHITECTURES)}); gate it on the reference engine"
        )
    engine = {**LLM_ARGS, **job.get("engine", {})}
    max_len = int(engine.pop("max_model_len", arch["max_position_embeddings"]))
    llm = vllm.LLM(
        model=job["checkpoint"],
        dtype=kp["dense_math_dtype"],
        max_model_len=max_len,
        hf_overrides={
            "architectures": [ARCHITECTURES[family]],
            "contractgen": {
                "arch": arch,
                "kernel_policy": kp,
                "plant_stock": job.get("plant_stock"),
            },
        },
        **engine,
    )
    llm.collective_rpc(install, args=(kp, arch["vocab_size"]))
    return llm


def _sampling(r: dict, *, max_tokens: int, prompt_logprobs: int | None = None):
    from vllm import SamplingParams  # optional: vllm

    from .sampler import EXTRA_KEY  # optional: vllm

    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0,  # vLLM's own processing never runs: the contract sampler draws
        logprobs=0,
        prompt_logprobs=prompt_logprobs,
        ignore_eos=True,
        stop_token_ids=list(r.get("stop_token_ids", ())),
        detokenize=False,
        extra_args={EXTRA_KEY: {k: r[k] for k in ("seed", "temperature", "top_k", "top_p")}},
    )


def generate(llm, requests: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """Every request to completion, each joining at its ``arrival_step`` (engine steps);
    ``rid -> (new tokens, their logprobs)``."""
    from vllm.inputs import TokensPrompt  # optional: vllm

    eng = llm.llm_engine
    pending = sorted(requests, key=lambda r: (r.get("arrival_step", 0), r["rid"]))
    done: dict[str, tuple[list[int], list[float]]] = {}
    step = 0
    while pending or eng.has_unfinished_requests():
        while pending and pending[0].get("arrival_step", 0) <= step:
            r = pending.pop(0)
            eng.add_request(
                r["rid"],
                TokensPrompt(prompt_token_ids=list(r["prompt"])),
                _sampling(r, max_tokens=r["max_new_tokens"]),
            )
        if not eng.has_unfinished_requests():
            step += 1
            continue
        for out in eng.step():
            if out.finished:
                c = out.outputs[0]
                lps = [d[t].logprob for t, d in zip(c.token_ids, c.logprobs, strict=True)]
                done[out.request_id] = (list(c.token_ids), lps)
        step += 1
    return done


def rescore(llm, requests: list[dict], sequences: dict[str, list[int]]) -> dict[str, list[float]]:
    """Prompt logprobs of every finished sequence (one prefill each, batched and chunked by the
    scheduler), under the request's processed distribution: ``rid -> logprobs of tokens 1..``."""
    from vllm.inputs import TokensPrompt  # optional: vllm

    eng = llm.llm_engine
    for r in requests:
        eng.add_request(
            "rescore-" + r["rid"],
            TokensPrompt(prompt_token_ids=sequences[r["rid"]]),
            _sampling(r, max_tokens=1, prompt_logprobs=0),
        )
    out: dict[str, list[float]] = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                seq = sequences[o.request_id.removeprefix("rescore-")]
                lps = o.prompt_logprobs[1:]
                out[o.request_id.removeprefix("rescore-")] = [
                    d[t].logprob for t, d in zip(seq[1:], lps, strict=True)
                ]
    return out


def push_weights(llm, path: str) -> dict:
    """Weights from a safetensors file pushed into the running engine in place."""
    from safetensors.torch import load_file  # heavy

    weights = load_file(path)
    t0 = time.perf_counter()

    def load(worker, items):
        return sorted(worker.model_runner.model.load_weights(items))

    loaded = llm.collective_rpc(load, args=(list(weights.items()),))[0]
    llm.reset_prefix_cache()
    return {"tensors": len(loaded), "seconds": time.perf_counter() - t0}


def counts(llm) -> dict:
    def read(worker):
        from . import model, sampler  # optional: vllm

        return {**model.CALLS, **sampler.CALLS}

    return llm.collective_rpc(read)[0]


def stock_ops(worker) -> list[str]:
    """``collective_rpc`` target: what on the scored path is vLLM's own rather than the contract's
    (empty for a contract run): any vLLM custom op or pluggable layer in the model (its RMSNorm,
    rotary embedding, linear, vocab embedding, logits processor), an attention layer whose
    implementation is not the contract's, a sampler or prompt scorer that is not the contract's.
    A torch function mode alone does not see these: they call vLLM's C++ ops directly."""
    from vllm.model_executor.custom_op import CustomOp, PluggableLayer  # optional: vllm
    from vllm.model_executor.layers.attention.attention import Attention  # optional: vllm

    from .model import ContractAttentionImpl  # optional: vllm
    from .sampler import ContractSampler, prompt_logprobs  # optional: vllm

    runner = worker.model_runner
    found = []
    for name, mod in runner.model.named_modules():
        if isinstance(mod, Attention):
            if not isinstance(mod.impl, ContractAttentionImpl):
                found.append(f"{name}: attention impl {type(mod.impl).__name__}")
        elif isinstance(mod, (CustomOp, PluggableLayer)):
            found.append(f"{name}: {type(mod).__name__}")
    if not isinstance(runner.sampler, ContractSampler):
        found.append(f"sampler: {type(runner.sampler).__name__}")
    scorer = getattr(runner._get_prompt_logprobs_dict, "__func__", None)
    if scorer is not prompt_logprobs:
        found.append("prompt logprobs: vLLM's own")
    return found


def run_job(job: dict, out_dir: Path) -> dict:
    import torch  # heavy
    from safetensors.torch import save_file  # heavy

    t0 = time.perf_counter()
    llm = build_llm(job)
    meta = {"start_s": time.perf_counter() - t0, "runs": {}, "updates": []}
    import vllm  # optional: vllm

    meta["vllm"] = vllm.__version__
    lp_dtype = getattr(torch, job["kernel_policy"]["logsoftmax_dtype"])
    tensors: dict[str, torch.Tensor] = {}
    updates = job.get("updates") or {}
    for i, run in enumerate(job["runs"]):
        if str(i) in updates:
            meta["updates"].append(push_weights(llm, updates[str(i)]))
        t1 = time.perf_counter()
        reqs = run["requests"]
        done = generate(llm, reqs)
        t2 = time.perf_counter()
        seqs = {r["rid"]: [*r["prompt"], *done[r["rid"]][0]] for r in reqs}
        scored = rescore(llm, reqs, seqs) if run.get("rescore", True) else {}
        t3 = time.perf_counter()
        for r in reqs:
            rid, (toks, lps) = r["rid"], done[r["rid"]]
            key = f"{run['name']}/{rid}"
            tensors[key + "/tokens"] = torch.tensor(toks, dtype=torch.int64)
            # the logprobs crossed vLLM's output as float32 -> Python float: exact for the
            # contract's dtype (bfloat16 / float32), cast back without rounding
            tensors[key + "/decode_lp"] = _exact(lps, lp_dtype)
            if rid in scored:
                n = len(r["prompt"])
                tensors[key + "/prefill_lp"] = _exact(scored[rid][n - 1 :], lp_dtype)
        meta["runs"][run["name"]] = {"generate_s": t2 - t1, "rescore_s": t3 - t2}
    meta["counts"] = counts(llm)
    meta["stock_ops"] = llm.collective_rpc(stock_ops)[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "result.safetensors"))
    (out_dir / "result.json").write_text(json.dumps(meta, indent=1))
    return meta


def _exact(values: list[float], dtype):
    import torch  # heavy

    t = torch.tensor(values, dtype=torch.float64)
    out = t.to(dtype)
    if not torch.equal(out.to(torch.float64), t):
        raise AssertionError(f"vllm runner: a logprob is not a {dtype} value (rounded on the way)")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m contractgen.adapters.vllm.runner JOB.json OUT_DIR", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    run_job(job, Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
