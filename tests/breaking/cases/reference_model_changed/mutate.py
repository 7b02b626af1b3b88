"""The parity gate's tiny reference model: a test fixture, so changing it is fine."""

from breaking_support import V1, replace


def mutate(root):
    replace(
        root,
        V1,
        "vocab_size: 1000, tie_word_embeddings: false, max_position_embeddings: 512",
        "vocab_size: 1024, tie_word_embeddings: false, max_position_embeddings: 512",
    )
