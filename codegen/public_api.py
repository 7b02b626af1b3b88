"""Public names the hand-kept true-on-policy modules carry (facts from docs PUBLIC_STACK.md).

The generated ``schema.py`` must be a superset of the public one, so its ``Literal`` aliases list
these values beside the ones our contracts define, and a public identity constant that no
contract here defines yet (sglang's ``QWEN3_MOE_TRUE_ON_POLICY_V1_SCHEMA``) is still emitted,
with the public values and no fingerprint. A contract file with that id takes the constant over:
its own values and fingerprint are emitted instead, and it enters ``CONTRACT_IDS``.
"""

from __future__ import annotations

PUBLIC_CONTRACT_NAMES = ("qwen3_dense_true_on_policy_v1", "qwen3_moe_true_on_policy_v1")
PUBLIC_MODEL_FAMILIES = ("qwen3_dense", "qwen3_moe", "qwen3_next")
PUBLIC_KERNEL_CONTRACTS = ("qwen3_dense_sglang_math", "qwen3_moe_sglang_math")
PUBLIC_LOGPROB_CONTRACTS = ("sglang_prefill",)

# Identity constants of the public modules, by contract id (TrueOnPolicyContractSchema fields).
PUBLIC_IDENTITIES: dict[str, dict[str, object]] = {
    "qwen3_moe_true_on_policy_v1": {
        "model_family": "qwen3_moe",
        "required_kernel_contracts": ("qwen3_dense_sglang_math", "qwen3_moe_sglang_math"),
        "logprob_contract": "sglang_prefill",
        "sglang_attention_backend": "fa3",
        "fsdp_attention_implementation": "flash_attention_3",
        "disable_megatron_sequence_parallel": True,
    },
}
