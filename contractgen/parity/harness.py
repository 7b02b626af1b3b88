"""Run the gate: rollout vs trainer logprobs, bitwise, per pairing; faults; HF reference.

The TP=1 rollout is the reference: the rollout runs at every rollout TP the gate is given and
the trainer (megatron-core module tree with the contract's layers) at every (TP, PP, CP) layout;
every scored response token's logprob is compared by bit pattern (``bits``: +0.0 is not -0.0)
for every (rollout TP, trainer layout) pair, against the rollout logprobs the contract's logprob
contract names. A mismatch is located by comparing each layer's output on both sides. With
faults, each field is flipped on one side and must make some layout differ; planted shared-kernel
bugs must be caught by the cross-TP comparison or by the transformers reference.
"""

from __future__ import annotations

from .compare import INT_OF_WIDTH, Comparison, bits, bits_digest, compare
from .fault_runs import (
    RETRY_WORKLOAD,
    _left_out,
    _retry_on_large_workload,
    _try_fault,
    _try_other_rollout_tps,
    _try_shared,
    fault_change,
    merged_faults,
    run_faults,
    unobservable_notes,
)
from .gate_run import ROLLOUT_LOGPROBS, GateConfig, GateRun
from .pairs import (
    _policies_at,
    first_divergence,
    pair_name,
    run_layouts,
    run_rollouts,
    same_tokens,
    trainer_for,
)

# The gate's one import point: callers and tests import these names from here.
__all__ = [
    "INT_OF_WIDTH",
    "RETRY_WORKLOAD",
    "ROLLOUT_LOGPROBS",
    "Comparison",
    "GateConfig",
    "GateRun",
    "_left_out",
    "_policies_at",
    "_retry_on_large_workload",
    "_try_fault",
    "_try_other_rollout_tps",
    "_try_shared",
    "bits",
    "bits_digest",
    "compare",
    "fault_change",
    "first_divergence",
    "merged_faults",
    "pair_name",
    "run_faults",
    "run_layouts",
    "run_rollouts",
    "same_tokens",
    "trainer_for",
    "unobservable_notes",
]
