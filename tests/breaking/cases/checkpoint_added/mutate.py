"""A new known checkpoint under v1: fine, the id's numerics are unchanged."""

from breaking_support import V1, replace


def mutate(root):
    replace(
        root,
        V1,
        "  reference_model:",
        "    - {name: Qwen3-0.6B-Base, hidden_size: 1024, intermediate_size: 3072, num_layers: 28,\n"
        "       num_attention_heads: 16, num_kv_heads: 8, head_dim: 128, vocab_size: 151936,\n"
        "       tie_word_embeddings: true, max_position_embeddings: 32768}\n"
        "  reference_model:",
    )
