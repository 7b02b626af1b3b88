"""Kernel numerics: v1's log-softmax in fp32 (what v2 is for)."""

from breaking_support import V1, replace


def mutate(root):
    replace(root, V1, "  logsoftmax_dtype: bfloat16", "  logsoftmax_dtype: float32")
