"""The CUDA backend of the contract kernels (Triton): the same tile orders and chunking as the
PyTorch reference, with each tile's dot on bf16 tensor cores (fp32 accumulate). Runs on CPU under
``TRITON_INTERPRET=1`` (small shapes, for CI)."""
