"""Known checkpoints listed in another order: fine."""

from breaking_support import V1, replace

B14 = (
    "    - {name: Qwen3-14B, hidden_size: 5120, intermediate_size: 17408, num_layers: 40,\n"
    "       num_attention_heads: 40, num_kv_heads: 8, head_dim: 128, vocab_size: 151936,\n"
    "       tie_word_embeddings: false, max_position_embeddings: 40960}\n"
)
B32 = (
    "    - {name: Qwen3-32B, hidden_size: 5120, intermediate_size: 25600, num_layers: 64,\n"
    "       num_attention_heads: 64, num_kv_heads: 8, head_dim: 128, vocab_size: 151936,\n"
    "       tie_word_embeddings: false, max_position_embeddings: 40960}\n"
)


def mutate(root):
    replace(root, V1, B14 + B32, B32 + B14)
