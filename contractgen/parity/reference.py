"""Agreement with Hugging Face transformers' own forward, in float32 (logprobs) and float64 (grads).

The reference model is the checkpoint directory (``--checkpoint``) or, by default, the contract's
reference model with the gate's seeded random weights loaded into the transformers class the
profile names (``hf_architecture``). transformers is optional: without it the report's
``reference`` is null and the reason is given.
"""

from __future__ import annotations

from contextlib import contextmanager
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
        **_moe_config(arch),
    )  # fmt: skip


# transformers 5's default experts kernel (torch grouped_mm) refuses float64 (the gradient
# reference) and expert rows that are not 16-byte multiples; its eager per-expert loop computes
# the same function in any dtype and width
EAGER_EXPERTS = {"experts_implementation": "eager"}


def _moe_config(arch: Any) -> dict:
    """The family's mixture-of-experts keys (``Family.moe.config_keys``, first HF name of each)
    with ``arch``'s values (tuples as the JSON lists config.json holds), and the eager experts
    implementation; none for a family without experts."""
    moe = arch.spec.moe
    if moe is None:
        return {}
    values = {keys[0]: getattr(arch, field) for field, keys in moe.config_keys.items()}
    values = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
    return {**values, **EAGER_EXPERTS}


class ReferenceUnavailable(RuntimeError):
    """transformers cannot build the reference model of a checkpoint (its config or files in a
    form transformers refuses): invalid input for the gate, not a parity failure."""


def hf_model(weights: Any, arch: Any, hf_architecture: str, dtype: torch.dtype):
    """transformers' model of a checkpoint directory or of an HF-named state dict."""
    import transformers

    if isinstance(weights, (str, Path)):
        eager = EAGER_EXPERTS if arch.spec.moe is not None else {}
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(weights), dtype=dtype, **eager
            )
        except Exception as exc:  # transformers' own reading of the config or the files
            raise ReferenceUnavailable(
                f"transformers {transformers.__version__} cannot load {weights} for the reference "
                f"comparison ({type(exc).__name__}: {exc}); --no-reference skips that comparison"
            ) from exc
        return model.eval()
    cls = getattr(transformers, hf_architecture)
    model = cls(hf_config(arch, hf_architecture)).to(dtype)
    missing, unexpected = model.load_state_dict(
        _to_model_layout(model, {k: v.to(dtype) for k, v in weights.items()}, arch), strict=False
    )
    # a tied head is one tensor, which transformers also lists under the LM head's name
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    may_miss = {arch.spec.model_weights["lm_head"].hf_name} if tied else set()
    if unexpected or not set(missing) <= may_miss:
        raise RuntimeError(f"state dict does not fit {hf_architecture}: {missing=} {unexpected=}")
    return model.eval()


def _to_model_layout(model, weights: dict[str, torch.Tensor], arch: Any) -> dict:
    """Checkpoint names -> the transformers model's own. transformers 5 keeps a layer's routed
    experts as two stacked tensors, ``mlp.experts.gate_up_proj`` ``[E, 2F, H]`` (gate rows, then
    up) and ``mlp.experts.down_proj`` ``[E, H, F]``, and converts per-expert checkpoint tensors
    (``mlp.experts.{e}.gate_proj.weight`` …) only in ``from_pretrained``: the same stacking is
    done here. Checkpoints keep their names where the model has them (dense layers, 4.x)."""
    own = model.state_dict()
    out = dict(weights)
    for i in range(arch.num_layers):
        prefix = f"model.layers.{i}.mlp.experts."
        if prefix + "gate_up_proj" not in own:
            continue
        experts = range(arch.num_experts)
        per = {r: [out.pop(f"{prefix}{e}.{r}_proj.weight") for e in experts] for r in _PROJ}
        out[prefix + "gate_up_proj"] = torch.stack(
            [torch.cat([g, u]) for g, u in zip(per["gate"], per["up"], strict=True)]
        )
        out[prefix + "down_proj"] = torch.stack(per["down"])
    return out


_PROJ = ("gate", "up", "down")


def hf_name(weights: Any) -> str:
    import transformers

    what = "checkpoint" if isinstance(weights, (str, Path)) else "reference model"
    return f"transformers {transformers.__version__} float32 forward ({what})"


def _topk_lowest_index_first(input, k, dim=-1, largest=True, sorted=True, *, out=None):
    """``torch.topk`` with ties to the lowest index. The values are gathered under autograd, as
    topk's are: the router's gradient flows through them (the float64 ``--grads`` reference)."""
    if out is not None:
        raise TypeError("the reference's torch.topk does not take out=")
    with torch.no_grad():
        order = torch.sort(input, dim=dim, descending=largest, stable=True).indices
    indices = order.narrow(dim, 0, k)
    return torch.return_types.topk((input.gather(dim, indices), indices))


@contextmanager
def ties_to_lowest_index():
    """transformers' MoE routers pick experts with ``torch.topk``, which leaves the order of equal
    values unspecified (on CPU it returns the higher index first for some rows). The reference
    model's tied router rows (``tied_router_experts``) make such ties real, so in here
    ``torch.topk`` breaks them to the lowest index, as the contracts'
    ``moe_topk_tie_break: lowest_expert_id``; values without a tie select what they did."""
    stock = torch.topk
    torch.topk = _topk_lowest_index_first
    try:
        yield
    finally:
        torch.topk = stock


def hf_logprobs(model, sequences: list[list[int]]) -> list[torch.Tensor]:
    """Per sequence: ``log p(seq[t + 1] | seq[: t + 1])`` for every t (float32); router ties
    to the lowest expert id (``ties_to_lowest_index``)."""
    out = []
    for seq in sequences:
        ids = torch.tensor([seq])
        with ties_to_lowest_index():
            logits = model(input_ids=ids).logits[0].float()
        out.append(torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0])
    return out


def hf_grads(model, sequences: list[list[int]], prompt_lens: list[int]) -> dict[str, torch.Tensor]:
    """HF-named gradients of ``-sum(logprob of every response token)`` (the trainer's loss) in
    ``model``'s dtype (float64 for the gate); router ties to the lowest expert id."""
    model.zero_grad(set_to_none=True)
    loss = 0
    for seq, p in zip(sequences, prompt_lens, strict=True):
        ids = torch.tensor([seq])
        with ties_to_lowest_index():
            logits = model(input_ids=ids).logits[0, :-1]
        lp = torch.log_softmax(logits, dim=-1)
        loss = loss - lp.gather(-1, ids[0, 1:, None])[p - 1 :, 0].sum()
    loss.backward()
    grads = {n: p.grad.detach() for n, p in model.named_parameters() if p.grad is not None}
    return _to_checkpoint_layout(grads)


def _to_checkpoint_layout(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of ``_to_model_layout``: stacked expert tensors back to per-expert checkpoint
    names (the names the trainer's gathered gradients carry)."""
    out = {}
    for name, t in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        if leaf == "gate_up_proj":
            for e, w in enumerate(t):
                gate, up = w.chunk(2)
                out[f"{prefix}.{e}.gate_proj.weight"] = gate
                out[f"{prefix}.{e}.up_proj.weight"] = up
        elif leaf == "down_proj" and prefix.endswith("mlp.experts"):
            out |= {f"{prefix}.{e}.down_proj.weight": w for e, w in enumerate(t)}
        else:
            out[name] = t
    return out


def max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    pairs = zip(a, b, strict=True)
    return max(float((x.detach().double() - y.detach().double()).abs().max()) for x, y in pairs)
