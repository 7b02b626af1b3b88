"""contractgen.adapters.sglang: the rollout target's adapter.

Its names (``codegen.targets.ROLE_API["rollout"]``) are what the parity gate calls, imported on
first use: the rollout ranks (``session.py``: a ``RolloutSession`` runs the role's
``common.rollout.RolloutJob``), the engine (``engine.py``), the reference model (``model.py``),
and the model description and checkpoint reading every target shares (``common/model.py``,
``common/checkpoint.py``). This package file imports nothing heavy.
"""

import importlib

# The layer blocks (``Family.layer_blocks``: MLP blocks, and a hybrid family's token mixers) the
# reference rollout model implements; the parity gate refuses a contract whose models need a
# block one side lacks (exit 2, one line).
MLP_BLOCKS = frozenset({"dense_mlp", "moe", "full_attention", "linear_attention"})

# What the ranks' fork server imports once (``common.workers.preload``): the rank code.
PRELOAD = ("contractgen.adapters.sglang.session",)

_LAZY = {
    "RolloutEngine": ".engine",
    "Request": "..common.rollout",
    "RolloutSession": ".session",
    "arch_of": ".session",
    "model_arch": ".session",
    "policies": ".session",
    "ModelArch": "..common.model",
    "ReferenceModel": ".model",
    "random_weights": "..common.model",
    "load_checkpoint": "..common.checkpoint",
    "check_checkpoint": "..common.checkpoint",
    "check_weight_files": "..common.checkpoint",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(name)
