"""Comments and YAML style only: a new comment, a flow list written as a block list."""

from breaking_support import V1, replace


def mutate(root):
    replace(
        root,
        V1,
        "  kernel_contracts: [qwen3_dense_sglang_math]",
        "  # the SGLang math kernels, as the public stack names them\n"
        "  kernel_contracts:\n"
        "    - qwen3_dense_sglang_math",
    )
