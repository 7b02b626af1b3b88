"""contractgen.adapters.megatron: SGLang numerics on real megatron-core, and the trainer forward.

Public API (see README.md in this folder):

- ``trainer_logprobs`` / ``trainer_logprobs_runs`` / ``TrainerSession`` (``trainer.py``): what
  the parity gate calls.
- ``SGLangSpecProvider``, ``get_sglang_block_spec`` (``provider.py``) and the layer classes
  (``layers.py``, ``attention.py``, ``transformer_layer.py``) for building a model yourself.
- ``TrueOnPolicyTransformerConfig`` and its resolved ``MegatronPolicy`` (``policy.py``).

Submodules import torch and megatron-core; this package file imports nothing heavy.
"""

# The layer blocks (``Family.layer_blocks``: MLP blocks, and a hybrid family's token mixers) the
# trainer's layer spec implements (``provider.py``: ``SGLangMLP``, megatron's ``MoELayer`` tree
# with the ``moe.py`` subclasses, ``SGLangSelfAttention`` and ``linear_attention.py``'s Gated
# DeltaNet); the parity gate refuses a contract whose models need another.
MLP_BLOCKS = frozenset({"dense_mlp", "moe", "full_attention", "linear_attention"})

# The layout axes this trainer runs (``adapters.common.layout.Layout``): model parallelism and its
# data parallelism (``dp``: DDP replicas), not fsdpN.
LAYOUT_AXES = frozenset({"tp", "pp", "cp", "dp", "ep"})

# Whether this trainer runs a contract's LoRA adapters (``parity --lora``; ``lora.py``).
LORA = True

# What the ranks' fork server imports once (``common.workers.preload``): megatron-core and the
# rank code (its import is seconds of CPU per rank otherwise).
PRELOAD = (
    "megatron.core.models.gpt",
    "megatron.core.optimizer",
    "contractgen.adapters.megatron.runtime",
)

__all__ = [
    "LAYOUT_AXES",
    "LORA",
    "MLP_BLOCKS",
    "Layout",
    "OptimizerSettings",
    "TrainBatch",
    "TrainInit",
    "TrainerFault",
    "TrainerResult",
    "TrainerRun",
    "TrainerSession",
    "trainer_logprobs",
    "trainer_logprobs_runs",
]


def __getattr__(name: str):
    if name in (
        "TrainerSession",
        "TrainerFault",
        "TrainerResult",
        "TrainerRun",
        "trainer_logprobs",
        "trainer_logprobs_runs",
    ):
        from . import trainer  # heavy: torch, on first use

        return getattr(trainer, name)
    if name in ("OptimizerSettings", "TrainBatch", "TrainInit"):
        from ..common import run_types  # heavy: torch, on first use

        return getattr(run_types, name)
    if name == "Layout":
        from ..common.layout import Layout  # lazy: this package file imports nothing

        return Layout
    raise AttributeError(name)
