"""A known checkpoint dropped from v1: launches of Qwen3-32B under v1 would now be refused."""

from breaking_support import V1, replace


def mutate(root):
    replace(
        root,
        V1,
        "    - {name: Qwen3-32B, hidden_size: 5120, intermediate_size: 25600, num_layers: 64,\n"
        "       num_attention_heads: 64, num_kv_heads: 8, head_dim: 128, vocab_size: 151936,\n"
        "       tie_word_embeddings: false, max_position_embeddings: 40960}\n",
        "",
    )
