"""Qwen3-Next on the rollout side, through its family module and the contract's linear-attention
kernel policy: transformers ``Qwen3NextForCausalLM`` agreement in float32 over prompts of several
delta-rule chunks (logits and greedy tokens, decode by the recurrent form), chunks at absolute
positions (a prefill split at a chunk boundary equals one prefill, bitwise), batch invariance and
run-to-run determinism (bitwise), and every new kernel-policy field shown to be read."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from contractgen.adapters.kernels.linear_attention import chunked_delta_rule
from contractgen.adapters.sglang.engine import Request, RolloutEngine
from contractgen.adapters.sglang.model import KVCache, ModelArch, ReferenceModel, random_weights
from contractgen.codegen.vendored import load_target
from contractgen.schema.models import HYBRID_KERNEL_FIELDS

NEXT = "qwen3_next_true_on_policy_v1"


def fp32_variant(kp, **changes):
    dtypes = {
        f.name: "float32"
        for f in dataclasses.fields(kp)
        if f.name.endswith("_dtype") and getattr(kp, f.name) is not None
    }
    return dataclasses.replace(kp, **dtypes, **changes)


@pytest.fixture(scope="module")
def policy():
    gen = load_target("sglang")
    kp = gen.schema.kernel_policy_for(NEXT)
    return SimpleNamespace(
        profile=gen.schema.model_profile_for(NEXT),
        kp=kp,
        rp=gen.runtime_policy.policy_for(NEXT, SimpleNamespace(tp_size=1)),
    )


def _small_arch(profile):
    """The reference model's layer pattern (linear, full, linear, full; layer 1 dense), smaller
    (test time): hidden 64, head_dim 16 (4 rotated dims), 2 key / 4 value heads of 16, 6
    experts of 32, top-2, a shared expert of 32. No tied router rows: transformers' router GEMM
    gives two equal weight rows logits an ulp apart at this width (the tie-break is the MoE
    tests' subject, not this file's)."""
    return dataclasses.replace(
        ModelArch.from_profile(profile),
        name="next-small",
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_kv_heads=2,
        head_dim=16,
        vocab_size=300,
        num_experts=6,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        tied_router_experts=None,
    )


@pytest.fixture(scope="module")
def small(policy):
    arch = _small_arch(policy.profile)
    return arch, random_weights(arch, seed=0)


def test_layers_follow_the_family(small):
    arch, weights = small
    spec = arch.spec
    assert [spec.mixer(arch, i) for i in range(4)] == [
        "linear_attention", "full_attention", "linear_attention", "full_attention",
    ]  # fmt: skip
    assert [sorted(spec.layer_blocks(arch, i) & {"moe", "dense_mlp"}) for i in range(4)] == [
        ["moe"], ["dense_mlp"], ["moe"], ["moe"],
    ]  # fmt: skip
    assert "model.layers.0.linear_attn.in_proj_qkvz.weight" in weights
    assert "model.layers.0.self_attn.q_proj.weight" not in weights
    assert "model.layers.1.linear_attn.A_log" not in weights
    # each head's query rows, then its gate rows
    assert weights["model.layers.1.self_attn.q_proj.weight"].shape == (2 * 4 * 16, 64)
    assert weights["model.layers.0.linear_attn.conv1d.weight"].shape == (2 * 32 + 64, 1, 4)
    assert "model.layers.3.mlp.shared_expert.down_proj.weight" in weights
    assert "model.layers.1.mlp.shared_expert_gate.weight" not in weights  # the dense layer


def _hf(arch, weights, profile):
    from contractgen.parity.reference import hf_model, reference_config

    dims = SimpleNamespace(**dataclasses.asdict(arch))
    dims.rope_scaling = None
    config = reference_config(profile, dims)
    assert config.layer_types == ["linear_attention", "full_attention"] * 2
    assert config.rope_parameters["partial_rotary_factor"] == 0.25
    return hf_model(weights, profile, torch.float32, dims)


def test_hf_qwen3_next_agreement_float32(small, policy):
    """Logits within 1e-5 relative over 100 tokens (7 chunks of 16), and the same greedy tokens
    from a 70-token prompt (prefill chunked, decode by the recurrent form)."""
    from contractgen.parity.reference import ties_to_lowest_index

    arch, weights = small
    hf = _hf(arch, weights, policy.profile)
    kp32 = fp32_variant(policy.kp, delta_rule_chunk=16)
    eng = RolloutEngine(ReferenceModel(arch, weights, kp32, policy.rp), progress=False)
    seq = torch.randint(0, 300, (100,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad(), ties_to_lowest_index():
        ref = hf(torch.tensor([seq])).logits[0]
        ours = eng.logits(seq)
        assert ours.dtype == torch.float32
        rel = (ours - ref).abs().max() / ref.abs().max()
        assert rel <= 1e-5, rel
        prompt, cur = seq[:70], list(seq[:70])
        for _ in range(4):
            cur.append(int(hf(torch.tensor([cur])).logits[0, -1].argmax()))
    assert eng.generate([Request("r", tuple(prompt), 4)])["r"].tokens == cur[70:]


def test_prefill_split_at_a_chunk_boundary_equals_one_prefill(small, policy):
    """Chunks start at absolute positions: a prefill of 48 tokens then one of 40 (the state and
    the conv taps carried in the request's cache) equals one prefill of 88, bit for bit."""
    arch, weights = small
    kp = dataclasses.replace(policy.kp, delta_rule_chunk=16)
    model = ReferenceModel(arch, weights, kp, policy.rp)
    ids = torch.randint(0, 300, (88,), generator=torch.Generator().manual_seed(2))
    whole = model.forward(ids, [KVCache()], [88], all_logits=True)
    cache = KVCache()
    first = model.forward(ids[:48], [cache], [48], all_logits=True)
    rest = model.forward(ids[48:], [cache], [40], all_logits=True)
    assert torch.equal(torch.cat([first, rest]), whole)
    assert set(cache.linear) == {0, 2}  # the linear-attention layers hold state


def test_chunks_realign_to_absolute_multiples():
    """A call starting mid-chunk ends its first chunk at the next multiple of C: continuing from
    position 24 with C=16 equals the one-call result only from where the partitions agree."""
    kp = SimpleNamespace(
        delta_rule_chunk=16, delta_rule_chunk_dtype="float32",
        delta_rule_state_dtype="float32", delta_rule_solve="row_substitution",
    )  # fmt: skip
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(40, 2, 8, generator=g), torch.randn(40, 2, 8, generator=g)
    v = torch.randn(40, 4, 8, generator=g)
    decay, beta = -0.1 * torch.rand(40, 4, generator=g), torch.rand(40, 4, generator=g)
    whole, s_whole = chunked_delta_rule(q, k, v, decay, beta, None, kp)
    a, s_a = chunked_delta_rule(q[:32], k[:32], v[:32], decay[:32], beta[:32], None, kp)
    b, s_b = chunked_delta_rule(q[32:], k[32:], v[32:], decay[32:], beta[32:], s_a, kp, start=32)
    assert torch.equal(torch.cat([a, b]), whole) and torch.equal(s_b, s_whole)
    c, _ = chunked_delta_rule(q[24:], k[24:], v[24:], decay[24:], beta[24:], None, kp, start=24)
    d, _ = chunked_delta_rule(q[24:], k[24:], v[24:], decay[24:], beta[24:], None, kp, start=0)
    assert not torch.equal(c, d)  # another partition of the same tokens: other roundings
    torch.testing.assert_close(c, d, rtol=1e-4, atol=1e-5)  # the same function


MIX = [
    Request("a", tuple(range(1, 20)), 3),
    Request("b", tuple(range(20, 60)), 3, temperature=1.0, seed=3, arrival_step=1),
    Request("c", (7,), 2, arrival_step=2),
]


def test_request_alone_equals_in_a_mixed_batch_and_runs_repeat(small, policy):
    """Bitwise: a request's tokens and logprobs alone equal those in a mixed batch (each
    request's recurrent and conv state is its own), and a second run equals the first. Chunks
    of 16: the prompts span several."""
    kp = dataclasses.replace(policy.kp, delta_rule_chunk=16)
    eng = RolloutEngine(ReferenceModel(*small, kp, policy.rp), progress=False)
    mixed = eng.generate(MIX)
    again = eng.generate(MIX)
    for r in MIX:
        alone = eng.generate([dataclasses.replace(r, arrival_step=0)])[r.rid]
        assert alone.tokens == mixed[r.rid].tokens, r.rid
        assert torch.equal(alone.logprob_tensor(), mixed[r.rid].logprob_tensor()), r.rid
        assert torch.equal(again[r.rid].logprob_tensor(), mixed[r.rid].logprob_tensor()), r.rid
    # the re-score of a finished sequence equals scoring it in one packed prefill with another
    b, a = mixed["b"].sequence, mixed["a"].sequence
    assert torch.equal(eng.rescore(b), eng.rescore(b))
    model = eng.model
    ids = torch.tensor(list(a) + list(b))
    both = model.forward(ids, [KVCache(), KVCache()], [len(a), len(b)], all_logits=True)
    alone = model.forward(torch.tensor(list(b)), [KVCache()], [len(b)], all_logits=True)
    assert torch.equal(both[len(a) :], alone)


def _int_bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


def test_float32_sequence_alone_equals_packed_on_the_reference_model(policy):
    """The parity gate's float32 check: every kernel dtype float32, each sequence scored alone
    (the rollout's re-score) equals its rows of one packed forward of several (a trainer-style
    pack), bit for bit (integer views), after every layer and in the logits. The contract's
    reference model (hidden 256; linear, full, linear, full; layer 1 dense; MoE with router
    rows 2 and 5 tied and a shared expert), 64-token chunks; 70 tokens span two chunks, and the
    pack shifts each sequence's rows against the vector loops of its tensors. The gates used
    ``torch.sigmoid``/``F.softplus``, whose CPU scalar tail differs from their vector body: the
    split this test was written for (the decay and beta, the shared expert's [T, 1] gate)."""
    arch = ModelArch.from_profile(policy.profile)
    assert (arch.hidden_size, arch.tied_router_experts) == (256, (2, 5))
    model = ReferenceModel(arch, random_weights(arch, seed=0), fp32_variant(policy.kp), policy.rp)
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, arch.vocab_size, (n,), generator=g) for n in (70, 37, 13)]
    packed_layers: list = []
    packed = model.forward(
        torch.cat(seqs), [KVCache() for _ in seqs], [len(s) for s in seqs], all_logits=True,
        layer_outputs=packed_layers,
    )  # fmt: skip
    assert packed.dtype == torch.float32 and len(packed_layers) == arch.num_layers
    lo = 0
    for j, ids in enumerate(seqs):
        rows = slice(lo, lo + len(ids))
        alone_layers: list = []
        alone = model.forward(
            ids, [KVCache()], [len(ids)], all_logits=True, layer_outputs=alone_layers
        )
        for i, (a, p) in enumerate(zip(alone_layers, packed_layers, strict=True)):
            assert torch.equal(_int_bits(a), _int_bits(p[rows])), f"sequence {j}, layer {i}"
        assert torch.equal(_int_bits(alone), _int_bits(packed[rows])), f"sequence {j}, logits"
        lo += len(ids)


FLIPS = {
    "delta_rule_chunk": 8,
    "delta_rule_chunk_dtype": "bfloat16",
    "delta_rule_state_dtype": "bfloat16",
    "delta_rule_solve": "lapack",
    "conv_dtype": "bfloat16",
    "gate_dtype": "bfloat16",
    "shared_expert_combine": "first_in_fold",
}


def test_every_hybrid_field_is_read(small, policy):
    """Flipping each new kernel-policy field changes the logits, from float32 numerics (where
    the float32 fields' alternatives are other dtypes and the chunk size and solve reorder float32
    roundings)."""
    assert set(FLIPS) == set(HYBRID_KERNEL_FIELDS)
    arch, weights = small
    base_kp = fp32_variant(policy.kp, delta_rule_chunk=16)
    seq = torch.randint(0, 300, (24,), generator=torch.Generator().manual_seed(4))

    def logits(kp):
        return ReferenceModel(arch, weights, kp, policy.rp).forward(
            seq, [KVCache()], [24], all_logits=True
        )

    base = logits(base_kp)
    unread = [
        f
        for f, v in FLIPS.items()
        if torch.equal(logits(dataclasses.replace(base_kp, **{f: v})), base)
    ]
    assert not unread


def test_tp_must_split_whole_key_head_groups(small, policy):
    """TP splits whole key-head groups (with their value heads): one key head at TP=2 is
    refused by name, before any collective."""
    arch, weights = small
    one = dataclasses.replace(arch, linear_num_key_heads=1, linear_num_value_heads=2)
    import contractgen.adapters.sglang.model as model_module

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(model_module, "world_size", lambda group: 2)
        mp.setattr(model_module.dist, "get_rank", lambda group: 0)
        with pytest.raises(ValueError, match="linear_num_key_heads=1 does not divide over TP=2"):
            ReferenceModel(one, random_weights(one, seed=0), policy.kp, policy.rp, group=object())


def test_tp2_equals_tp1(policy):
    """Rollout TP=2 over gloo: q/k/v/z and beta/decay of whole key-head groups per rank, the
    conv's q, k and v channels split part by part, out_proj by value heads (the contract's
    row-parallel tree), shared expert like the dense MLP: the same tokens and logprob bits."""
    import tp_helpers as tp

    # every row-parallel K (o_proj, out_proj, the experts' and the shared expert's down_proj)
    # 256 = 2 tiles of 128, one whole tile per rank (the contract's tile rule at TP=2)
    arch = dataclasses.replace(
        _small_arch(policy.profile), hidden_size=128, intermediate_size=256, head_dim=64,
        moe_intermediate_size=256, shared_expert_intermediate_size=256, num_experts=4,
        linear_key_head_dim=32, linear_value_head_dim=64,
    )  # fmt: skip
    weights = random_weights(arch, seed=0)
    kp = dataclasses.replace(policy.kp, delta_rule_chunk=16)
    gen = load_target("sglang")
    rp2 = gen.runtime_policy.policy_for(NEXT, SimpleNamespace(tp_size=2))
    got = tp.tp_rollout(2, arch, kp, rp2, MIX, weights=0, rescore=[list(range(5, 45))])
    eng = RolloutEngine(ReferenceModel(arch, weights, kp, policy.rp), progress=False)
    out = eng.generate(MIX)
    for rid, c in out.items():
        assert got["completions"][rid][0] == c.tokens, rid
        assert torch.equal(got["completions"][rid][1], c.logprob_tensor()), rid
    assert torch.equal(got["rescores"][0], eng.rescore(list(range(5, 45))))


def test_delta_rule_gradients_match_float64_autograd():
    """The chunked form is differentiable as written (no in-place writes): its float32
    gradients agree with float64 autograd through the same function (what a trainer needs)."""
    kp32 = SimpleNamespace(
        delta_rule_chunk=8, delta_rule_chunk_dtype="float32",
        delta_rule_state_dtype="float32", delta_rule_solve="row_substitution",
    )  # fmt: skip
    kp64 = SimpleNamespace(**{**vars(kp32), "delta_rule_chunk_dtype": "float64",
                              "delta_rule_state_dtype": "float64"})  # fmt: skip
    g = torch.Generator().manual_seed(5)
    inputs = [
        torch.randn(20, 2, 8, generator=g), torch.randn(20, 2, 8, generator=g),
        torch.randn(20, 4, 8, generator=g), -0.1 * torch.rand(20, 4, generator=g),
        torch.rand(20, 4, generator=g),
    ]  # fmt: skip
    weight = torch.randn(20, 4, 8, generator=g)

    def grads(kp, dtype):
        xs = [t.detach().to(dtype).requires_grad_() for t in inputs]
        o, state = chunked_delta_rule(*xs, None, kp)
        ((o * weight.to(dtype)).sum() + state.sum()).backward()
        return [x.grad for x in xs]

    for got, want in zip(grads(kp32, torch.float32), grads(kp64, torch.float64), strict=True):
        assert got.dtype == torch.float32
        assert float((got.double() - want).abs().max() / want.abs().max()) < 1e-5


def test_hf_checkpoint_directory_loads_and_agrees(tmp_path, policy):
    """A transformers-saved Qwen3-Next directory (layer_types and rope_parameters'
    partial_rotary_factor as transformers 5 writes them): the family reads its hybrid dims,
    the rollout loads its weights, and float32 logits agree with transformers'."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    from contractgen.adapters.common.checkpoint import (
        dims_from_hf_config,
        load_checkpoint,
        read_hf_config,
    )

    cfg = Qwen3NextConfig(
        vocab_size=200, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, full_attention_interval=2,
        mlp_only_layers=[1], max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25},
        experts_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    hf = Qwen3NextForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if "norm" in n:
                p.normal_(0.0, 0.1)
            elif n.endswith("A_log"):
                p.copy_(torch.log(0.01 + 0.09 * torch.rand_like(p)))
            elif n.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.5)
    hf.save_pretrained(tmp_path / "next")
    template = dataclasses.replace(policy.profile.reference_model, name="tiny", tp_sizes=None)
    dims = dims_from_hf_config(read_hf_config(tmp_path / "next"), template, "qwen3_next")
    assert (dims.full_attention_interval, dims.partial_rotary_factor) == (2, 0.25)
    assert dims.shared_expert_intermediate_size == 32 and dims.linear_num_value_heads == 4
    profile = dataclasses.replace(policy.profile, checkpoints=(dims,))
    arch, weights = load_checkpoint(tmp_path / "next", profile)
    kp32 = fp32_variant(policy.kp, delta_rule_chunk=16)
    eng = RolloutEngine(ReferenceModel(arch, weights, kp32, policy.rp), progress=False)
    seq = torch.randint(0, 200, (50,), generator=torch.Generator().manual_seed(6)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([seq])).logits[0]
    ours = eng.logits(seq)
    assert float((ours - ref).abs().max() / ref.abs().max()) <= 1e-5


def test_gate_refuses_a_trainer_without_the_linear_attention_block():
    """The megatron trainer has both mixers (``tests/megatron/test_qwen3_next_trainer.py``); a
    trainer target that lacks them (FSDP, today) is named in one line, exit 2, before any
    worker starts."""
    from click.testing import CliRunner

    from contractgen.cli import main

    result = CliRunner().invoke(main, ["parity", "--contract", NEXT, "--layouts", "fsdp2"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [
        f"error: {NEXT}: the trainer side (fsdp) is not implemented yet for the "
        "full_attention, linear_attention block of qwen3_next models (it implements: "
        "dense_mlp, moe); parity needs both sides"
    ]


@pytest.mark.parametrize("dtypes", ["contract", "float32"])
def test_decode_logprobs_equal_the_rescore_bitwise(small, policy, dtypes):
    """A decode step runs its unfinished delta-rule chunk again from the chunk's start
    (``continue_delta_rule``), so every sampled token's logprob has the re-score's bits (the
    trainer's, under v1), in the contract's dtypes and in float32; the generations cross chunk
    boundaries of 16 mid-decode (prompts of 13, 30 and 47 tokens, 12 new tokens each). The
    recurrent form, which the decode ran before, is shown to differ (so the equality is not
    vacuous)."""
    from contractgen.adapters.kernels import linear_attention as la

    kp = dataclasses.replace(policy.kp, delta_rule_chunk=16)
    kp = fp32_variant(kp) if dtypes == "float32" else kp
    eng = RolloutEngine(ReferenceModel(*small, kp, policy.rp), progress=False)
    g = torch.Generator().manual_seed(9)
    reqs = [
        Request(f"r{n}", tuple(torch.randint(0, 300, (n,), generator=g).tolist()), 12)
        for n in (13, 30, 47)
    ]
    out = eng.generate(reqs)
    for r in reqs:
        c = out[r.rid]
        rescored = eng.rescore(c.sequence)[len(r.prompt) - 1 :]
        assert _int_bits(c.logprob_tensor()).equal(_int_bits(rescored)), r.rid

    state = torch.zeros(4, 16, 16)
    q, k = torch.randn(5, 2, 16, generator=g), torch.randn(5, 2, 16, generator=g)
    v, decay = torch.randn(5, 4, 16, generator=g), -0.1 * torch.rand(5, 4, generator=g)
    beta = torch.rand(5, 4, generator=g)
    chunked, _ = la.chunked_delta_rule(q, k, v, decay, beta, state, kp)
    _, s4 = la.recurrent_delta_rule(q[:4], k[:4], v[:4], decay[:4], beta[:4], state, kp)
    last, _ = la.recurrent_delta_rule(q[4:], k[4:], v[4:], decay[4:], beta[4:], s4, kp)
    assert not torch.equal(last[0], chunked[4])
