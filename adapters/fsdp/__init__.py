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

# What ``contractgen parity --trainers …,fsdp`` runs when no ``--layouts`` is given.
DEFAULT_LAYOUTS = "fsdp1,fsdp2"

__all__ = [
    "DEFAULT_LAYOUTS",
    "LAYOUT_AXES",
    "MLP_BLOCKS",
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
