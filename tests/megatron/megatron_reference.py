"""The oracle for the Megatron-side tests: the rollout's own reference model (SGLang numerics).

``rollout_rescore`` is the ``sglang_prefill`` logprob contract: one prefill pass over a finished
sequence with ``contractgen.adapters.sglang``'s ``ReferenceModel`` at TP=1.
"""

from __future__ import annotations

import dataclasses

import torch

from contractgen.adapters.megatron.model import arch_for
from contractgen.adapters.megatron.policy import generated
from contractgen.adapters.sglang.engine import RolloutEngine
from contractgen.adapters.sglang.model import ReferenceModel, random_weights
from contractgen.codegen.vendored import load_target

V1 = "qwen3_dense_true_on_policy_v1"
V2 = "qwen3_dense_true_on_policy_v2"


def tiny_arch(contract_id: str = V1, num_layers: int | None = None):
    """The contract's reference model, optionally with fewer layers (test speed)."""

    arch = arch_for(contract_id)
    return dataclasses.replace(arch, num_layers=num_layers) if num_layers else arch


def weights_for(arch, seed: int = 0) -> dict[str, torch.Tensor]:
    return random_weights(arch, seed)


def _engine(contract_id: str, arch, weights, kp=None) -> RolloutEngine:
    kp = kp if kp is not None else generated().schema.kernel_policy_for(contract_id)
    rp = load_target("sglang").runtime_policy.policy_for(contract_id, None)
    return RolloutEngine(ReferenceModel(arch, weights, kp, rp), progress=False)


def rollout_rescore(contract_id: str, arch, weights, sequences, kp=None) -> list[torch.Tensor]:
    """Prefill re-score logprobs of each sequence on the rollout side (TP=1)."""
    engine = _engine(contract_id, arch, weights, kp)
    return [engine.rescore(s) for s in sequences]


def rollout_layer_outputs(contract_id: str, arch, weights, sequence, kp=None) -> list[torch.Tensor]:
    """The rollout's residual stream after every layer (``[len, hidden]`` each)."""
    outs: list[torch.Tensor] = []
    _engine(contract_id, arch, weights, kp).rescore(sequence, layer_outputs=outs)
    return outs


def random_sequences(lengths, vocab: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
