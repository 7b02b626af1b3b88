"""SGLang-side true-on-policy kernels: pure PyTorch, one small module each, casts explicit."""

from .all_reduce import all_reduce_for, pairwise_sum, tree_all_reduce, tree_sum
from .attention import chunked_attention
from .linear import column_parallel_linear, row_parallel_linear
from .logsoftmax import full_logprobs, token_logprobs, vocab_parallel_token_logprobs
from .matmul import binary_matmul, combine_tiles, invariant_matmul, tile_partials
from .mlp import silu_glu
from .norm import rms_norm
from .residual import residual_add
from .rope import apply_rope, rope_cos_sin

__all__ = [
    "all_reduce_for",
    "apply_rope",
    "binary_matmul",
    "chunked_attention",
    "column_parallel_linear",
    "combine_tiles",
    "full_logprobs",
    "invariant_matmul",
    "pairwise_sum",
    "residual_add",
    "rms_norm",
    "rope_cos_sin",
    "row_parallel_linear",
    "silu_glu",
    "tile_partials",
    "token_logprobs",
    "tree_all_reduce",
    "tree_sum",
    "vocab_parallel_token_logprobs",
]
