"""The exact-zero parity gate: rollout logprobs vs trainer logprobs, bitwise, per layout."""
