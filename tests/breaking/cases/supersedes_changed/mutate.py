"""The supersession link dropped from v2: metadata, not numerics; fine."""

from breaking_support import V2, replace


def mutate(root):
    replace(root, V2, "supersedes: qwen3_dense_true_on_policy_v1", "supersedes: null")
