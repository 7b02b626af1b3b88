"""Pipeline driver for CPU (gloo): forward, and forward + backward for training steps.

megatron-core's schedules and p2p code allocate on CUDA (``torch.cuda.current_device()``), so on
CPU we drive the *same* stage modules (megatron's own split: ``pre_process`` / ``post_process``
and layer offsets from ``parallel_state``) with this small loop: stage ``i`` receives the
previous stage's output with ``torch.distributed.recv``, hands it to
``GPTModel.set_input_tensor`` and sends its own output on. What crosses the boundary is the
tensor the last layer emitted (with ``use_sglang_residual_pair``, ``cat([output, residual])``),
sent as-is: no cast, no add. A shape/dtype header goes first so stages need no shape
bookkeeping. ``pipeline_forward_backward`` runs one microbatch forward and back: gradients of
the boundary tensors travel back the same way. On GPU, megatron-core's
``get_forward_backward_func`` is the production path (not used here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps

_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def send_tensor(t: torch.Tensor, dst: int) -> None:
    """Header (ndim, shape..., dtype code) then the tensor, to global rank ``dst``."""
    header = torch.tensor(
        [t.dim(), *t.shape, _DTYPES.index(t.dtype)], dtype=torch.long, device=t.device
    )
    dist.send(torch.tensor([header.numel()], dtype=torch.long, device=t.device), dst)
    dist.send(header, dst)
    dist.send(t.detach().contiguous(), dst)


def recv_tensor(src: int, device: torch.device) -> torch.Tensor:
    n = torch.empty(1, dtype=torch.long, device=device)
    dist.recv(n, src)
    header = torch.empty(int(n), dtype=torch.long, device=device)
    dist.recv(header, src)
    ndim = int(header[0])
    shape = [int(s) for s in header[1 : 1 + ndim]]
    out = torch.empty(shape, dtype=_DTYPES[int(header[1 + ndim])], device=device)
    dist.recv(out, src)
    return out


def pipeline_forward(model: Any, **forward_kwargs: Any) -> torch.Tensor | None:
    """Run this rank's stage; returns the last stage's output, ``None`` on other stages."""
    if not ps.is_pipeline_first_stage():
        device = next(model.parameters()).device
        model.set_input_tensor(recv_tensor(ps.get_pipeline_model_parallel_prev_rank(), device))
    out = model(**forward_kwargs)
    if not ps.is_pipeline_last_stage():
        send_tensor(out, ps.get_pipeline_model_parallel_next_rank())
        return None
    return out


def pipeline_forward_backward(
    model: Any, loss_fn: Callable[[torch.Tensor], tuple[torch.Tensor, Any]], **forward_kwargs: Any
) -> Any:
    """One forward and backward of this rank's stage (one microbatch, no interleaving).

    Forward as ``pipeline_forward``, with the received activation marked as requiring a gradient;
    the last stage calls ``loss_fn(output) -> (loss, result)`` and back-propagates ``loss``; every
    other stage receives the gradient of its output from the next stage and back-propagates it;
    each stage but the first sends the gradient of its input back. Returns the last stage's
    ``result`` (``None`` elsewhere); parameter gradients are left in ``.grad``.
    """
    received = None
    device = next(model.parameters()).device
    if not ps.is_pipeline_first_stage():
        received = recv_tensor(ps.get_pipeline_model_parallel_prev_rank(), device)
        received.requires_grad_(True)
        model.set_input_tensor(received)
    out = model(**forward_kwargs)
    result = None
    if ps.is_pipeline_last_stage():
        loss, result = loss_fn(out)
        loss.backward()
    else:
        nxt = ps.get_pipeline_model_parallel_next_rank()
        send_tensor(out, nxt)
        torch.autograd.backward(out, recv_tensor(nxt, device))
    if received is not None:
        grad = received.grad if received.grad is not None else torch.zeros_like(received)
        send_tensor(grad, ps.get_pipeline_model_parallel_prev_rank())
    return result
