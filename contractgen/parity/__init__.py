"""The exact-zero parity gate: rollout logprobs vs trainer logprobs, bitwise, per layout.

The gate reaches its targets through the registry only (``targets.py``): the rollout target's
``RolloutSession`` and the trainer targets' ``TrainerSession``, paired by role."""
