"""Model structure: RoPE base and norm epsilon of an existing id (QK-norm is the family's)."""

from breaking_support import V1, replace


def mutate(root):
    replace(root, V1, "theta: 1000000.0", "theta: 500000.0")
    replace(root, V1, "eps: 1.0e-6", "eps: 1.0e-5")
