"""Model structure: RoPE base and QK-norm of an existing id."""

from breaking_support import V1, replace


def mutate(root):
    replace(root, V1, "theta: 1000000.0", "theta: 500000.0")
    replace(root, V1, "qk_norm: true", "qk_norm: false")
