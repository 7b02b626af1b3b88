"""Identity of an existing id: the attention backend SGLang is told to use, and the FSDP attention implementation."""

from breaking_support import V1, replace


def mutate(root):
    replace(root, V1, "sglang_attention_backend: fa3", "sglang_attention_backend: fa4")
    replace(
        root,
        V1,
        "fsdp_attention_implementation: flash_attention_3",
        "fsdp_attention_implementation: flash_attention_2",
    )
