"""The trainer's mixed-precision optimizer on any device: megatron-core's
``Float16OptimizerWithFloat16Params`` set up on CPU tensors too (``make_optimizer``)."""

from __future__ import annotations

import torch
from megatron.core import tensor_parallel
from megatron.core.optimizer import OptimizerConfig
from megatron.core.optimizer.optimizer import (
    Float16OptimizerWithFloat16Params,
    MegatronOptimizer,
)

from ..common.run_types import OptimizerSettings


class CpuMixedPrecisionOptimizer(Float16OptimizerWithFloat16Params):
    """megatron-core's ``Float16OptimizerWithFloat16Params`` on CPU tensors.

    Its constructor only accepts ``torch.cuda.*Tensor`` parameters and allocates its unit loss
    scale on CUDA; this one sets up the same state (an fp32 main copy of every 16-bit parameter,
    put in the optimizer's param groups in its place) on any device. Everything else, the step
    included (model grads -> fp32 main grads, ``optimizer.step()``, main params -> model params),
    is megatron-core's own code.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, config: OptimizerConfig) -> None:
        MegatronOptimizer.__init__(self, optimizer, config, lambda *_: None)
        self.grad_scaler = None
        self._dummy_overflow_buf = None  # no multi-tensor apply: megatron's plain copy loop
        self._scale_one = torch.tensor([1.0])
        self.float16_groups, self.fp32_from_float16_groups, self.fp32_from_fp32_groups = [], [], []
        for group in optimizer.param_groups:
            half, main, full = [], [], []
            for i, param in enumerate(group["params"]):
                if not param.requires_grad:
                    continue
                if param.dtype in (torch.bfloat16, torch.float16):
                    copy = param.detach().clone().float()
                    tensor_parallel.copy_tensor_model_parallel_attributes(copy, param)
                    group["params"][i] = copy
                    param.main_param = copy
                    half.append(param)
                    main.append(copy)
                else:
                    full.append(param)
            self.float16_groups.append(half)
            self.fp32_from_float16_groups.append(main)
            self.fp32_from_fp32_groups.append(full)
        self.is_stub_optimizer = False


def make_optimizer(
    model: torch.nn.Module, settings: OptimizerSettings, device: str
) -> MegatronOptimizer:
    """AdamW over the stage's parameters inside megatron-core's mixed-precision optimizer."""
    params = [p for p in model.parameters() if p.requires_grad]
    dtype = params[0].dtype
    config = OptimizerConfig(
        optimizer="adam",
        lr=settings.lr,
        weight_decay=settings.weight_decay,
        adam_beta1=settings.betas[0],
        adam_beta2=settings.betas[1],
        adam_eps=settings.eps,
        clip_grad=settings.clip_grad,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
    )
    adam = torch.optim.AdamW(
        params,
        lr=settings.lr,
        betas=settings.betas,
        eps=settings.eps,
        weight_decay=settings.weight_decay,
    )
    if device == "cuda":
        return Float16OptimizerWithFloat16Params(adam, config, None, lambda *_: None)
    return CpuMixedPrecisionOptimizer(adam, config)
