"""A known checkpoint's dims: Qwen3-4B loses TP=4 under v1."""

from breaking_support import V1, replace


def mutate(root):
    replace(
        root,
        V1,
        "max_position_embeddings: 40960, tp_sizes: [1, 2, 4]}",
        "max_position_embeddings: 40960, tp_sizes: [1, 2]}",
    )
