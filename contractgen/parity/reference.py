"""Agreement with Hugging Face transformers' own forward of a checkpoint, in float32.

transformers is optional: without it the report's ``reference`` is null and the reason is given.
"""

from __future__ import annotations

from pathlib import Path

import torch


def transformers_reason() -> str | None:
    """None if transformers can be imported, else why not."""
    try:
        import transformers  # noqa: F401
    except ImportError as exc:
        return f"transformers is not installed ({exc})"
    return None


@torch.no_grad()
def reference_logprobs(checkpoint: Path, sequences: list[list[int]], prompt_lens: list[int]):
    """(name, per-sequence float32 logprobs of the scored tokens) from transformers' forward."""
    import transformers
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
    model.eval()
    out = []
    for seq, p in zip(sequences, prompt_lens, strict=True):
        ids = torch.tensor([seq])
        logits = model(input_ids=ids).logits[0].float()
        lp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
        out.append(lp[p - 1 :])
    return f"transformers {transformers.__version__} float32 forward", out


def max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b, strict=True))
