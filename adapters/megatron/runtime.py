"""Per-process pieces of the trainer forward: gloo init, stage build, forward, logprobs.

What megatron-core needs on CPU, found by running it: ``torch.distributed`` initialised with
gloo, then ``parallel_state.initialize_model_parallel(tp, pp, context_parallel_size=cp)`` (it
creates gloo groups and never touches CUDA on that path); a config with
``use_cpu_initialization=True`` and ``transformer_impl='local'``; no fusions; and a model whose
CUDA-only pieces (rotary embedding, default causal mask, global memory buffer through
``DotProductAttention``, output gather) are never built or called: ``position_embedding_type=
'none'``, our core attention, ``parallel_output=True``. The CUDA RNG tracker is only used under
sequence parallel or dropout, both off under a contract.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps

from .checkpoint import load_hf_state_dict, load_into
from .kernels import kernel_module
from .model import Layout, build_model, make_config
from .packing import pack_sequences
from .policy import float32_kernel_policy, generated, policy_for


def init_distributed(rank: int, layout: Layout, port: int) -> None:
    """gloo process group on localhost, then megatron-core's model-parallel groups."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=layout.world_size)
    ps.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        context_parallel_size=layout.cp,
    )


def shutdown() -> None:
    if dist.is_initialized():
        ps.destroy_model_parallel()
        dist.destroy_process_group()


def resolve_policies(job: Any) -> tuple[Any, Any]:
    """(runtime policy override or None, kernel policy) for the job's contract, dtype and fault."""
    kp = generated().schema.kernel_policy_for(job.contract_id)
    if job.dtype_override == "float32":
        kp = float32_kernel_policy(kp)
    elif job.dtype_override not in (None, "bfloat16"):
        raise ValueError(
            f"dtype_override must be None, 'bfloat16' or 'float32' (got {job.dtype_override!r})"
        )
    fault = job.fault
    if fault is not None and fault.kernel_policy:
        from .trainer import with_fault

        kp = with_fault(kp, fault.kernel_policy)
    return None, kp


def build_stage(job: Any) -> tuple[Any, Any, int]:
    """This rank's model stage with weights loaded: ``(model, config, padded_vocab)``."""
    _, kp = resolve_policies(job)
    config = make_config(job.contract_id, job.shape, job.layout, kernel_policy=kp)
    if job.fault is not None and job.fault.runtime_policy:
        from .trainer import with_fault

        config.true_on_policy_runtime_policy_override = with_fault(
            policy_for(config), job.fault.runtime_policy
        )
    padded = job.shape.padded_vocab_size(job.layout.tp, int(kp.logsoftmax_vocab_block))
    torch.manual_seed(0)
    model = build_model(
        config,
        job.shape,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        padded_vocab_size=padded,
    )
    hf = load_hf_state_dict(job.weights) if isinstance(job.weights, str) else job.weights
    load_into(
        model,
        hf,
        job.shape,
        tp_rank=ps.get_tensor_model_parallel_rank(),
        tp_size=job.layout.tp,
        padded_vocab_size=padded,
    )
    model.eval()
    return model, config, padded


def _all_gather_cat(t: torch.Tensor, group: Any, dim: int) -> torch.Tensor:
    """Concatenate every rank's ``t`` along ``dim`` in rank order (moves bits, never adds)."""
    n = dist.get_world_size(group)
    if n == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _trim_to_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    return logits[..., :vocab]


def _keep_padded(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    return logits


LOGITS_BY_APPLY_LOGITS_CONTRACT = {True: _trim_to_vocab, False: _keep_padded}


def stage_logprobs(job: Any) -> Any:
    """Forward on this rank; the rank holding full logprobs returns a ``TrainerResult``."""
    from .pipeline import pipeline_forward
    from .trainer import TrainerResult

    model, config, _ = build_stage(job)
    policy = policy_for(config)
    kp = model.output_layer.kernel_policy if ps.is_pipeline_last_stage() else None
    cp, cp_rank = job.layout.cp, ps.get_context_parallel_rank()
    pack = pack_sequences(
        job.sequences,
        prompt_lens=job.prompt_lens,
        prefix_tree=job.prefix_tree,
        pad_to_multiple=cp,
    )
    params = pack.seq_params()
    local = pack.token_ids.numel() // cp
    sl = slice(cp_rank * local, (cp_rank + 1) * local)
    with torch.no_grad():
        out = pipeline_forward(
            model,
            input_ids=pack.token_ids[sl][None],
            position_ids=pack.positions[sl][None],
            attention_mask=None,
            packed_seq_params=params,
        )
    if out is None:
        return None
    logits = out[0]  # [T/cp, V/tp]
    logits = _all_gather_cat(logits, ps.get_tensor_model_parallel_group(), dim=-1)
    logits = _all_gather_cat(logits, ps.get_context_parallel_group(), dim=0)
    logits = LOGITS_BY_APPLY_LOGITS_CONTRACT[bool(policy.apply_logits_contract)](
        logits, config.true_on_policy_vocab_size
    )
    if ps.get_tensor_model_parallel_rank() != 0 or cp_rank != 0:
        return None
    token_logprobs = kernel_module("logsoftmax").token_logprobs
    vocab = logits.shape[-1]
    logprobs = []
    for path in pack.paths:
        rows, targets = path[:-1], pack.token_ids[path[1:]]
        logprobs.append(token_logprobs(logits[rows], targets, kp, vocab))
    return TrainerResult(logprobs=logprobs)
