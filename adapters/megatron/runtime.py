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

import logging
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

from ..common import policy as common_policy
from ..common.data_parallel import dp_share
from ..common.distributed import start_process_group
from ..common.layout import Layout
from ..common.packing import pack_sequences
from ..common.run_types import TrainerResult
from ..common.sampling import process_shard
from ..kernels.logsoftmax import vocab_parallel_token_logprobs
from ..kernels.policy import KernelPolicy
from .checkpoint import load_into
from .gather import gather_hf, gather_stages, tied_embedding_group
from .grads import finalize_grads
from .layers import residual_add, split_carrier
from .lora import attach_lora, gather_adapter_grads
from .model import build_model, make_config, padded_vocab_size
from .packing import thd_params
from .pipeline import pipeline_forward, pipeline_forward_backward
from .policy import MegatronPolicy, generated


def init_distributed(rank: int, layout: Layout, port: int, device: str = "cpu") -> None:
    """The process group (``common.distributed``: joined at the session's rendezvous on
    ``port``), then megatron-core's model-parallel groups."""
    # megatron-core matches MLP specs by identity, so our MLP subclass is logged as "Unknown MLP
    # type" on every layer; without a tp_group kwarg the MLP takes parallel_state's TP group, the
    # same group megatron would have passed.
    logging.getLogger("megatron.core.transformer.transformer_layer").setLevel(logging.ERROR)
    start_process_group(rank, layout.world_size, port, device)
    ps.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        # EP > 1: whole experts per rank (expert TP 1); EP 1: experts split over TP as the MLP
        expert_tensor_parallel_size=1 if layout.ep > 1 else None,
    )


def shutdown() -> None:
    if dist.is_initialized():
        ps.destroy_model_parallel()
        dist.destroy_process_group()


def pp_rank() -> int:
    return ps.get_pipeline_model_parallel_rank()


def resolve_kernel_policy(contract_id: str, run: Any) -> KernelPolicy:
    """The contract's KernelPolicy under the run's dtype override and kernel-policy fault."""
    return common_policy.resolve_kernel_policy(generated().schema, contract_id, run)


class Stage(NamedTuple):
    """This rank's model stage with weights loaded, and the config and policies it was built with
    (``policy``: resolved once by ``make_config``; the same object every layer holds)."""

    model: Any
    config: Any
    padded_vocab: int
    policy: MegatronPolicy


def build_stage(job: Any, run: Any) -> Stage:
    """This rank's model stage with weights loaded (see ``Stage``)."""
    kp = resolve_kernel_policy(job.contract_id, run)
    changes = run.fault.runtime_policy if run.fault is not None else None
    config = make_config(
        job.contract_id, job.arch, job.layout, kernel_policy=kp, runtime_changes=changes
    )
    policy = config.true_on_policy
    # megatron's random init stays on although ``load_into`` overwrites every parameter: it is
    # also what marks the TP-sharded parameters (``tensor_model_parallel``, ``partition_dim``)
    # that gathering weights and gradients back to HF names reads
    padded = padded_vocab_size(job.arch, job.layout.tp, kp)
    torch.manual_seed(0)
    model = build_model(
        config,
        job.arch,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        padded_vocab_size=padded,
    ).to(job.device)
    load_into(
        model,
        job.weights,
        job.arch,
        tp_rank=ps.get_tensor_model_parallel_rank(),
        tp_size=job.layout.tp,
        padded_vocab_size=padded,
        ep=(ps.get_expert_model_parallel_rank(), job.layout.ep),
    )
    model.lora_branches = attach_lora(
        model,
        job.weights,
        job.arch,
        kp,
        tp_rank=ps.get_tensor_model_parallel_rank(),
        tp_size=job.layout.tp,
        tp_group=ps.get_tensor_model_parallel_group(),
    )
    model.eval()
    return Stage(model, config, padded, policy)


def _all_gather_cat(t: torch.Tensor, group: Any, dim: int) -> torch.Tensor:
    """Concatenate every rank's ``t`` along ``dim`` in rank order (moves bits, never adds)."""
    n = dist.get_world_size(group)
    if n == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _real_vocab(real: int, padded: int) -> int:
    return real


def _padded_vocab(real: int, padded: int) -> int:
    return padded


# apply_logits_contract: log-softmax over the real vocabulary (padding trimmed) or over all of it.
LOGPROB_VOCAB_BY_APPLY_LOGITS_CONTRACT = {True: _real_vocab, False: _padded_vocab}


def _rows_of(t: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``t[rows]``; a view when ``rows`` is one ascending run (a flat pack's path), so a
    ``[tokens, vocab]`` logits matrix is not copied per sequence."""
    n = rows.numel()
    if n and int(rows[-1]) - int(rows[0]) == n - 1:
        lo = int(rows[0])
        if torch.equal(rows, torch.arange(lo, lo + n, device=rows.device, dtype=rows.dtype)):
            return t[lo : lo + n]
    return t[rows]


def stage_logprobs(job: Any, run: Any) -> tuple[Any, Any]:
    """Forward on this rank: ``(TrainerResult or None, layer dumps of this stage or None)``.

    Under data parallelism (``Layout.dp`` > 1, or the attention DP that EP beyond TP x CP needs:
    ``Layout.ep_dp`` > 1; a DP layout's forward is its TP x PP x CP layout's) each DP rank scores
    ``dp_share`` of the sequences; its result lists ``None`` for the others (the session merges
    the DP ranks' lists). Layer dumps (``first_divergence``) are per sequence of one pack, so a
    dumping run has every DP rank score every sequence and only DP rank 0 answer."""
    model, config, padded, policies = build_stage(job, run)
    policy, kp = policies.rp, policies.kp
    cp, cp_rank = job.layout.cp, ps.get_context_parallel_rank()
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    whole = dp == 1 or run.dump_layers
    share = list(range(len(job.sequences))) if whole else dp_share(len(job.sequences), dp, dp_rank)
    if not whole and len(job.sequences) < dp:  # every rank refuses: none waits in a collective
        raise ValueError(
            f"layout {job.layout.name} splits the sequences over {dp} data-parallel ranks: "
            f"give at least {dp} sequences (got {len(job.sequences)})"
        )
    mine = [job.sequences[i] for i in share]
    prompt_lens = None if run.prompt_lens is None else [run.prompt_lens[i] for i in share]
    pack = pack_sequences(
        mine,
        prompt_lens=prompt_lens,
        prefix_tree=run.prefix_tree,
        pad_to_multiple=cp,
    )
    params = thd_params(pack).to(job.device)
    token_ids, positions = pack.token_ids.to(job.device), pack.positions.to(job.device)
    local = pack.token_ids.numel() // cp
    sl = slice(cp_rank * local, (cp_rank + 1) * local)
    cp_group = ps.get_context_parallel_group()
    dumps: dict[str, torch.Tensor] = {}
    if run.dump_layers:

        def record(name: str, carrier: torch.Tensor) -> None:
            out, residual = split_carrier(carrier[:, 0], config.hidden_size)
            stream = out if residual is None else residual_add(out, residual, kp)
            dumps[name] = _all_gather_cat(stream, cp_group, dim=0).cpu()

        for layer in model.decoder.layers:
            layer.dump = record
    with torch.no_grad():
        out = pipeline_forward(
            model,
            input_ids=token_ids[sl][None],
            position_ids=positions[sl][None],
            attention_mask=None,
            packed_seq_params=params,
        )
    first = (
        ps.get_tensor_model_parallel_rank() == 0 and cp_rank == 0 and (not whole or dp_rank == 0)
    )
    per_seq = None
    if run.dump_layers and first:
        per_seq = [{k: v[path] for k, v in dumps.items()} for path in pack.paths]
    if out is None:
        return None, per_seq
    logits = _all_gather_cat(out[0], cp_group, dim=0)  # [T, V/tp]
    vocab = LOGPROB_VOCAB_BY_APPLY_LOGITS_CONTRACT[bool(policy.apply_logits_contract)](
        config.true_on_policy_vocab_size, padded
    )
    tp_group = ps.get_tensor_model_parallel_group()
    vocab_start = ps.get_tensor_model_parallel_rank() * logits.shape[-1]
    lp_fn = vocab_parallel_token_logprobs
    logprobs = []
    for k, path in enumerate(pack.paths):
        rows, targets = path[:-1].to(job.device), token_ids[path[1:].to(job.device)]
        x = _rows_of(logits, rows)
        if run.sampling is not None:  # the processed distribution the sampler drew from
            x = process_shard(x, run.sampling[share[k]], kp, vocab_start, vocab, tp_group)
        logprobs.append(lp_fn(x, targets, vocab_start, vocab, kp, tp_group).cpu())
    if not first:
        return None, per_seq
    if not whole:
        spread: list[Any] = [None] * len(job.sequences)
        for i, lp in zip(share, logprobs, strict=True):
            spread[i] = lp
        logprobs = spread
    return TrainerResult(logprobs=logprobs), per_seq


def stage_grads(job: Any, run: Any) -> tuple[Any, None]:
    """One backward (TP, CP and PP aware): see ``TrainerRun.grads``."""
    model, config, padded, policies = build_stage(job, run)
    model.train()
    lora = torch.nn.ModuleList(model.lora_branches) if model.lora_branches else None
    if lora is not None:  # LoRA: the base is frozen as in training; A and B take gradients
        for p in model.parameters():
            p.requires_grad_(False)
    policy = policies.rp
    cp, cp_rank = job.layout.cp, ps.get_context_parallel_rank()
    pack = pack_sequences(job.sequences, pad_to_multiple=cp)
    params = thd_params(pack).to(job.device)
    targets = torch.zeros_like(pack.token_ids)
    mask = torch.zeros(pack.token_ids.shape, dtype=torch.bool)
    starts = run.prompt_lens or (1,) * len(pack.paths)  # loss over response tokens only
    for path, p in zip(pack.paths, starts, strict=True):
        targets[path[:-1]] = pack.token_ids[path[1:]]
        mask[path[p - 1 : -1]] = True
    local = pack.token_ids.numel() // cp
    sl = slice(cp_rank * local, (cp_rank + 1) * local)

    def loss_fn(logits: torch.Tensor) -> tuple[torch.Tensor, None]:  # [1, T/cp, V/tp]
        local_logits = logits[0].float()
        if policy.apply_logits_contract:  # padded vocab columns take no probability mass
            vocab_start = ps.get_tensor_model_parallel_rank() * local_logits.shape[-1]
            column = torch.arange(local_logits.shape[-1], device=local_logits.device) + vocab_start
            local_logits = local_logits.masked_fill(
                column >= config.true_on_policy_vocab_size, float("-inf")
            )
        ce = vocab_parallel_cross_entropy(local_logits, targets[sl].to(job.device))
        return (ce * mask[sl].to(job.device)).sum(), None

    pipeline_forward_backward(
        model,
        loss_fn,
        input_ids=pack.token_ids[sl][None].to(job.device),
        position_ids=pack.positions[sl][None].to(job.device),
        attention_mask=None,
        packed_seq_params=params,
    )
    finalize_grads(
        model if lora is None else lora,
        policy,
        group=ps.get_data_parallel_group(with_context_parallel=True),
        dp=ps.get_data_parallel_world_size(),
        cp=cp,
        tp_group=ps.get_tensor_model_parallel_group(),
        embedding_group=tied_embedding_group(job) if lora is None else None,
    )
    if lora is None:
        hf = gather_hf(model, job, lambda p: torch.zeros_like(p) if p.grad is None else p.grad)
    else:  # the adapter's gradients alone, every stage's sent to rank 0
        hf = gather_stages(gather_adapter_grads(list(lora), ps.get_tensor_model_parallel_group()))
    if dist.get_rank() != 0:
        return None, None
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}
    return TrainerResult(logprobs=[], grads=grads, hf_grads=hf), None
