"""Agreement with Hugging Face transformers' own forward, in float32 (logprobs) and float64 (grads).

The reference model is the checkpoint directory (``--checkpoint``) or, by default, the contract's
reference model with the gate's seeded random weights loaded into the transformers class the
profile names (``hf_architecture``). transformers is optional: without it the report's
``reference`` is null and the reason is given.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

# |our float32 logprob - transformers' float32 logprob| allowed at every layout (both sides sum
# in other orders; measured 2e-6 on the reference model over 272-token sequences).
LOGPROB_TOLERANCE = 1e-4
# Sequences of the HF check: longer than several 64-position KV chunks (the chunk merge is compared).
REFERENCE_LENGTHS = (272, 257)


def transformers_reason() -> str | None:
    """None if transformers can be imported, else why not."""
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        return f"transformers is not installed ({exc})"
    return None


def reference_sequences(vocab_size: int, max_positions: int) -> list[list[int]]:
    """Seeded random token sequences of ``REFERENCE_LENGTHS`` (capped at the model's positions)."""
    g = torch.Generator().manual_seed(4321)
    lengths = [min(n, max_positions) for n in REFERENCE_LENGTHS]
    return [torch.randint(0, vocab_size, (n,), generator=g).tolist() for n in lengths]


def hf_config(arch: Any, hf_architecture: str):
    """transformers' config of ``hf_architecture`` with ``arch``'s dims and RoPE."""
    import transformers

    rope = {"rope_type": "default"}
    if arch.rope_scaling is not None:  # the contract's (type, factor, …), as transformers 5 has it
        params = dict(arch.rope_scaling)
        rope = {"rope_type": params.pop("type", None) or params.pop("rope_type"), **params}
    return getattr(transformers, hf_architecture).config_class(
        vocab_size=arch.vocab_size, hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size, num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_attention_heads, num_key_value_heads=arch.num_kv_heads,
        head_dim=arch.head_dim, max_position_embeddings=arch.max_position_embeddings,
        rms_norm_eps=arch.norm_eps, tie_word_embeddings=arch.tie_word_embeddings,
        rope_parameters={**rope, "rope_theta": arch.rope_theta},
    )  # fmt: skip


def hf_model(weights: Any, arch: Any, hf_architecture: str, dtype: torch.dtype):
    """transformers' model of a checkpoint directory or of an HF-named state dict."""
    import transformers

    if isinstance(weights, (str, Path)):
        model = transformers.AutoModelForCausalLM.from_pretrained(str(weights), dtype=dtype)
        return model.eval()
    cls = getattr(transformers, hf_architecture)
    model = cls(hf_config(arch, hf_architecture)).to(dtype)
    missing, unexpected = model.load_state_dict(
        {k: v.to(dtype) for k, v in weights.items()}, strict=False
    )
    # a tied head is one tensor, which transformers also lists under the LM head's name
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    may_miss = {arch.spec.model_weights["lm_head"].hf_name} if tied else set()
    if unexpected or not set(missing) <= may_miss:
        raise RuntimeError(f"state dict does not fit {hf_architecture}: {missing=} {unexpected=}")
    return model.eval()


def hf_name(weights: Any) -> str:
    import transformers

    what = "checkpoint" if isinstance(weights, (str, Path)) else "reference model"
    return f"transformers {transformers.__version__} float32 forward ({what})"


@torch.no_grad()
def hf_logprobs(model, sequences: list[list[int]]) -> list[torch.Tensor]:
    """Per sequence: ``log p(seq[t + 1] | seq[: t + 1])`` for every t (float32)."""
    out = []
    for seq in sequences:
        ids = torch.tensor([seq])
        logits = model(input_ids=ids).logits[0].float()
        out.append(torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0])
    return out


def hf_grads(model, sequences: list[list[int]], prompt_lens: list[int]) -> dict[str, torch.Tensor]:
    """HF-named gradients of ``-sum(logprob of every response token)`` (the trainer's loss) in
    ``model``'s dtype (float64 for the gate)."""
    model.zero_grad(set_to_none=True)
    loss = 0
    for seq, p in zip(sequences, prompt_lens, strict=True):
        ids = torch.tensor([seq])
        lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], dim=-1)
        loss = loss - lp.gather(-1, ids[0, 1:, None])[p - 1 :, 0].sum()
    loss.backward()
    return {n: p.grad.detach() for n, p in model.named_parameters() if p.grad is not None}


def max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b, strict=True))
