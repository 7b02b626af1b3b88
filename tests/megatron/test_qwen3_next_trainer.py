"""Issue 35, the trainer side of Qwen3-Next: megatron-core with the hybrid layer spec (Gated
DeltaNet and output-gated full attention with partial RoPE, zero-centred norms, the shared
expert) scores packed sequences with the bits of the rollout's per-sequence re-score at TP1, TP2
and PP2; one kernel-policy field changed on the trainer alone breaks that; its float32 gradients
agree with transformers' float64 autograd (gathered back to HF names, so the conversion both
ways is checked); CP is refused in one line."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from megatron_reference import random_sequences, rollout_rescore

from contractgen.adapters.common.layout import Layout
from contractgen.adapters.megatron.model import arch_for, make_config
from contractgen.adapters.megatron.trainer import TrainerFault, TrainerRun, TrainerSession
from contractgen.adapters.sglang.model import random_weights

NEXT = "qwen3_next_true_on_policy_v1"

pytestmark = pytest.mark.slow

# Past two 64-token delta-rule chunks and 64-position KV chunks; one short sequence.
LENGTHS = (150, 9, 70)


@pytest.fixture(scope="module")
def arch():
    """The reference model's layers (linear, full, linear, full; layer 1 dense; shared expert),
    smaller: every row-parallel K (o_proj, out_proj, the experts' and the shared expert's
    down_proj) is 256 = 2 tiles of 128, a whole tile per rank at TP2 (the contract's rule)."""
    return dataclasses.replace(
        arch_for(NEXT), name="next-small", hidden_size=128, intermediate_size=256,
        head_dim=64, moe_intermediate_size=256, shared_expert_intermediate_size=256,
        num_experts=4, num_experts_per_tok=2, tied_router_experts=None,
        linear_key_head_dim=32, linear_value_head_dim=64, vocab_size=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def weights(arch):
    return random_weights(arch, seed=0)


@pytest.fixture(scope="module")
def sequences(arch):
    return random_sequences(LENGTHS, arch.vocab_size, seed=1)


@pytest.fixture(scope="module")
def rollout(arch, weights, sequences):
    return rollout_rescore(NEXT, arch, weights, sequences)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _same_bits(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    return all(torch.equal(_bits(a), _bits(b)) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("layout", [(1, 1, 1), (2, 1, 1), (1, 2, 1)], ids=["tp1", "tp2", "pp2"])
def test_trainer_scores_with_the_rollout_bits(arch, weights, sequences, rollout, layout):
    """Packed trainer forward == the rollout's re-score of each sequence alone, bit for bit."""
    with TrainerSession(NEXT, weights, layout, arch=arch) as s:
        got = s.logprobs(sequences).logprobs
    assert _same_bits(got, rollout)


def test_prefix_tree_pack_scores_with_the_rollout_bits(arch, weights, rollout, sequences):
    """Two responses to one prompt packed as a prefix tree (the prompt's rows once): each
    path's delta rule runs over its own rows from position 0, so the bits are each sequence's
    own re-score's."""
    prompt = sequences[0][:80]
    seqs = [prompt + sequences[2][:30], prompt + sequences[1]]
    want = rollout_rescore(NEXT, arch, weights, seqs)
    run = TrainerRun(prefix_tree=True, prompt_lens=(80, 80))
    with TrainerSession(NEXT, weights, (1, 1, 1), arch=arch) as s:
        got = s.logprobs(seqs, run).logprobs
    assert _same_bits(got, want)


@pytest.mark.parametrize(
    "field, value",
    [("delta_rule_chunk", 32), ("gate_dtype", "bfloat16"), ("conv_dtype", "bfloat16")],
)
def test_one_field_changed_on_the_trainer_breaks_equality(
    arch, weights, sequences, rollout, field, value
):
    """The trainer reads each linear-attention field: changed on its side alone (the rollout
    keeps the contract's), its logprobs leave the rollout's bits; the honest run keeps them."""
    fault = TrainerFault(kernel_policy={field: value})
    with TrainerSession(NEXT, weights, (1, 1, 1), arch=arch) as s:
        honest = s.logprobs(sequences).logprobs
        faulted = s.logprobs(sequences, TrainerRun(fault=fault)).logprobs
    assert _same_bits(honest, rollout)
    assert not _same_bits(faulted, rollout)


@pytest.mark.parametrize("layout", [(1, 1, 1), (2, 1, 1)], ids=["tp1", "tp2"])
def test_gradients_agree_with_float64_transformers(arch, weights, sequences, layout):
    """float32 trainer gradients of the response tokens' loss, gathered over TP to HF names
    (the conv's parts re-interleaved, the output norm's TP sum), vs float64 autograd through
    transformers' ``Qwen3NextForCausalLM`` (its pure-torch delta rule and conv)."""
    pytest.importorskip("transformers")
    from contractgen.adapters.megatron.policy import generated
    from contractgen.parity.correctness import GRAD_TOLERANCE
    from contractgen.parity.reference import hf_grads, hf_model

    prompt_lens = [n // 2 for n in LENGTHS]
    model = hf_model(weights, generated().schema.model_profile_for(NEXT), torch.float64, arch)
    want = hf_grads(model, sequences, prompt_lens)
    run = TrainerRun(dtype_override="float32", grads=True, prompt_lens=tuple(prompt_lens))
    with TrainerSession(NEXT, weights, layout, arch=arch) as s:
        got = s.logprobs(sequences, run).hf_grads
    assert set(got) == set(want)
    linear = [n for n in got if "linear_attn" in n]
    assert linear, "no linear-attention gradients"
    for name, g in got.items():
        w = want[name].double()
        rel = float((g.double() - w).abs().max()) / max(float(w.abs().max()), 1e-30)
        assert rel <= GRAD_TOLERANCE, (name, rel)


def test_context_parallelism_is_refused_in_one_line(arch):
    """CP over linear-attention layers is not built: the config refuses it with the reason
    (before megatron-core's own assertion)."""
    with pytest.raises(ValueError) as err:
        make_config(NEXT, arch, Layout(cp=2))
    assert str(err.value) == (
        "context parallelism (CP=2) is not built for linear-attention (Gated DeltaNet) "
        "layers: their recurrent state runs through every token of a sequence in order and "
        "no CP rank hands it to the next; use CP 1"
    )


def test_gate_names_the_reason_when_cp_is_asked_for():
    """``parity --layouts cp2`` on the hybrid contract: refused (exit 2) with the reason."""
    from click.testing import CliRunner

    from contractgen.cli import main

    result = CliRunner().invoke(main, ["parity", "--contract", NEXT, "--layouts", "cp2"])
    assert result.exit_code == 2, result.output
    assert (
        "cp2: --cp 2: context parallelism over qwen3_next's linear-attention layers is not "
        "built (their recurrent state runs through every token in order and would have to "
        "pass between CP ranks)"
    ) in result.output
