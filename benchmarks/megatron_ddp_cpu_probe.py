"""Does megatron-core's ``DistributedDataParallel`` (and so its distributed optimizer, which works
on DDP's buffers) build on CPU over gloo? Two gloo ranks wrap one bf16 ``Linear`` in DDP, with
``use_distributed_optimizer`` off and on, and print what happens.

With megatron-core 0.16.1 and CPU torch both fail in ``_ParamAndGradBuffer.__init__``: the grad
(and param) buffers are allocated with ``device=torch.cuda.current_device()``, and
``DistributedDataParallelConfig`` has no device field. That is why the trainer's data
parallelism is ``adapters/megatron/data_parallel.py`` (see its docstring).

    .venv/bin/python benchmarks/megatron_ddp_cpu_probe.py
"""

from __future__ import annotations

import os
import socket
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, port: int) -> None:
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig

    ps.initialize_model_parallel(1, 1)
    config = TransformerConfig(
        num_layers=1, hidden_size=8, num_attention_heads=1, use_cpu_initialization=True,
        bf16=True, params_dtype=torch.bfloat16,
    )  # fmt: skip
    for distributed_optimizer in (False, True):
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, use_distributed_optimizer=distributed_optimizer
        )
        try:
            DistributedDataParallel(config, ddp_config, torch.nn.Linear(8, 8).bfloat16())
            outcome = "builds"
        except Exception as exc:  # what the probe is for: report it
            outcome = f"fails: {type(exc).__name__}: {exc}"
        if rank == 0:
            print(f"DDP(use_distributed_optimizer={distributed_optimizer}) on CPU: {outcome}")
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def main() -> None:
    import megatron.core

    print(f"megatron-core {megatron.core.__version__}, torch {torch.__version__}, "
          f"CUDA available: {torch.cuda.is_available()}")  # fmt: skip
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port,), nprocs=2, join=True)


if __name__ == "__main__":
    main()
