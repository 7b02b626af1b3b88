"""contractgen.adapters.fsdp: the FSDP2 trainer target on transformers' own model classes.

transformers' ``Qwen3ForCausalLM``, ``LlamaForCausalLM`` and ``Qwen3MoeForCausalLM`` with the
contract's ops attached (``ops.py``: module replacement, attention through transformers'
``AttentionInterface``), sharded with ``torch.distributed.fsdp.fully_shard`` (``model.py``),
run in spawned ranks (``runtime.py``) behind ``TrainerSession`` (``trainer.py``). See README.md.

This package file imports nothing heavy: the names of ``ROLE_API["trainer"]`` load lazily.
"""

# The MLP blocks (``Family.layer_blocks``) this target attaches (``ops.MLP_BLOCKS``).
MLP_BLOCKS = frozenset({"dense_mlp", "moe"})

# The layout axes this trainer runs (``adapters.common.layout.Layout``): FSDP ranks only, no model
# parallelism; the gate gives it the ``fsdpN`` layouts and no others.
LAYOUT_AXES = frozenset({"fsdp"})

# Whether ``TrainerSession.logprobs`` takes ``TrainerRun(grads=True)`` (the gradient check
# against float64 autograd, ``runtime.backward_grads``): yes.
GRADIENT_RUN = True

# How ``--train-steps`` trains here (``adapters/fsdp/training.py``), in the report's words.
TRAINING_DESCRIPTION = {
    "data_parallel": "FSDP2: each rank every world-th sequence, one microbatch; gradients "
    "reduce-scattered by FSDP in reduce_dtype",
    "optimizer": "torch.optim.AdamW on the FSDP-sharded parameters (master_dtype), lr {lr}, "
    "no weight decay, no grad clipping; a full state dict pushed in param_dtype",
}

# Whether this trainer runs a contract's LoRA adapters (``parity --lora``): not yet; the gate
# refuses ``--lora`` with it, naming the trainers that do.
LORA = False

# Runtime-policy fields of this target no forward logprob can show under any contract (the gate's
# --inject-faults lists them as explained, and fails if one is detected after all). Kept here,
# not in each contract's ``unobservable`` notes, because they follow from how this target runs
# (the notes are in the numerics fingerprint: adding a target must not move shipped ones).
UNOBSERVABLE = {
    "reduce_dtype": (
        "The dtype FSDP reduce-scatters gradients in (MixedPrecisionPolicy.reduce_dtype): "
        "backward only. The forward all-gathers parameters (nothing summed) and scores each "
        "sequence on one rank, so no logprob can show it; it changes the gradients AdamW is given."
    ),
    "keep_fp32_master": (
        "Whether the sharded parameters AdamW updates are float32 or param_dtype. Every forward "
        "gathers them in param_dtype either way, and float32 weights rounded to param_dtype at "
        "the gather have the bits of the same weights rounded at load, so no forward logprob can "
        "show it; it decides how much of a small update an optimizer step keeps."
    ),
}

# What ``contractgen parity --trainers …,fsdp`` runs when no ``--layouts`` is given.
DEFAULT_LAYOUTS = "fsdp1,fsdp2"

__all__ = [
    "DEFAULT_LAYOUTS",
    "GRADIENT_RUN",
    "LAYOUT_AXES",
    "LORA",
    "MLP_BLOCKS",
    "TRAINING_DESCRIPTION",
    "UNOBSERVABLE",
    "OptimizerSettings",
    "TrainBatch",
    "TrainInit",
    "TrainerFault",
    "TrainerRun",
    "TrainerSession",
]


def __getattr__(name: str):
    if name == "TrainerSession":
        from .trainer import TrainerSession  # heavy: torch, on first use

        return TrainerSession
    if name in ("TrainerFault", "TrainerRun", "TrainBatch", "TrainInit", "OptimizerSettings"):
        from ..common import run_types  # heavy: torch, on first use

        return getattr(run_types, name)
    raise AttributeError(name)
