"""contractgen.adapters.fsdp: the FSDP2 trainer target on transformers' own model classes.

transformers' ``Qwen3ForCausalLM``, ``LlamaForCausalLM`` and ``Qwen3MoeForCausalLM`` with the
contract's ops attached (``ops.py``: module replacement, attention through transformers'
``AttentionInterface``), sharded with ``torch.distributed.fsdp.fully_shard`` (``model.py``),
run in spawned ranks (``runtime.py``) behind ``TrainerSession`` (``trainer.py``). See README.md.

This package file imports nothing heavy: the names of ``ROLE_API["trainer"]`` load lazily.
"""

# The MLP blocks (``Family.layer_blocks``) this target attaches (``ops.MLP_BLOCKS``).
MLP_BLOCKS = frozenset({"dense_mlp", "moe"})

# The layout axes this trainer runs (``adapters.layout.Layout``): FSDP ranks only, no model
# parallelism; the gate gives it the ``fsdpN`` layouts and no others.
LAYOUT_AXES = frozenset({"fsdp"})

# Whether ``TrainerSession.logprobs`` takes ``TrainerRun(grads=True)`` (the gradient check
# against float64 autograd): not yet here; ``--train-steps`` reports its step-0 check as not
# supported for this target.
GRADIENT_RUN = False

# How ``--train-steps`` trains here (``adapters/fsdp/training.py``), in the report's words.
TRAINING_DESCRIPTION = {
    "data_parallel": "FSDP2: each rank every world-th sequence, one microbatch; gradients "
    "reduce-scattered by FSDP in reduce_dtype",
    "optimizer": "torch.optim.AdamW on the FSDP-sharded parameters (master_dtype), lr {lr}, "
    "no weight decay, no grad clipping; a full state dict pushed in param_dtype",
}

# What ``contractgen parity --trainers …,fsdp`` runs when no ``--layouts`` is given.
DEFAULT_LAYOUTS = "fsdp1,fsdp2"

__all__ = [
    "DEFAULT_LAYOUTS",
    "GRADIENT_RUN",
    "LAYOUT_AXES",
    "MLP_BLOCKS",
    "TRAINING_DESCRIPTION",
    "OptimizerSettings",
    "TrainBatch",
    "TrainInit",
    "TrainerFault",
    "TrainerRun",
    "TrainerSession",
]


def __getattr__(name: str):
    if name == "TrainerSession":
        from .trainer import TrainerSession

        return TrainerSession
    if name in ("TrainerFault", "TrainerRun", "TrainBatch", "TrainInit", "OptimizerSettings"):
        from . import run_types

        return getattr(run_types, name)
    raise AttributeError(name)
