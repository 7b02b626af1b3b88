"""Parallel support: rollout TP=8 dropped from v1."""

from breaking_support import V1, replace


def mutate(root):
    replace(root, V1, "  rollout:\n    tp: [1, 2, 4, 8]", "  rollout:\n    tp: [1, 2, 4]")
