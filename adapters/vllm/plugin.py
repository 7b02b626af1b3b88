"""The ``vllm.general_plugins`` entry point (pyproject): registers the contract's model class under
one architecture name per supported family. vLLM loads general plugins in every process it starts;
registering by ``"module:Class"`` string imports nothing until a run selects the architecture
(``LLM(..., hf_overrides={"architectures": [ARCHITECTURES[family]], ...})``)."""

from __future__ import annotations

MODEL_CLASS = "contractgen.adapters.vllm.model:ContractForCausalLM"

# family -> the architecture name a run selects
ARCHITECTURES = {
    "qwen3_dense": "ContractgenQwen3ForCausalLM",
    "llama3_dense": "ContractgenLlama3ForCausalLM",
}


def register() -> None:
    """Register every family's architecture (idempotent: vLLM may call it more than once)."""
    from vllm import ModelRegistry  # optional: vllm (.venv-vllm only)

    known = set(ModelRegistry.get_supported_archs())
    for arch in ARCHITECTURES.values():
        if arch not in known:
            ModelRegistry.register_model(arch, MODEL_CLASS)
