"""Qwen3-MoE on the rollout side, through its family module and the contract's MoE kernel policy:
Hugging Face ``Qwen3MoeForCausalLM`` agreement in float32 (norm_topk_prob on and off, a dense
layer among MoE layers), batch invariance of routing, the lowest-id tie-break, TP=2 equal to
TP=1, and every MoE policy field shown to be read (flipping it changes the output, or, for the
token order, provably cannot)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from contractgen.adapters.common.checkpoint import (
    dims_from_hf_config,
    load_checkpoint,
    read_hf_config,
)
from contractgen.adapters.kernels import moe
from contractgen.adapters.sglang.engine import Request, RolloutEngine
from contractgen.adapters.sglang.model import ModelArch, ReferenceModel, random_weights
from contractgen.codegen.vendored import load_target

MOE = "qwen3_moe_true_on_policy_v1"
HF_CASES = {
    # mlp_only_layers puts a dense MLP among the MoE layers; sparse step 1 elsewhere
    "norm_topk_dense_layer1": dict(norm_topk_prob=True, mlp_only_layers=[1], decoder_sparse_step=1),
    "no_norm_topk_step2": dict(norm_topk_prob=False, mlp_only_layers=[], decoder_sparse_step=2),
}


def fp32_variant(kp):
    return dataclasses.replace(
        kp, **{f.name: "float32" for f in dataclasses.fields(kp) if f.name.endswith("_dtype")}
    )


@pytest.fixture(scope="module")
def moe_policy():
    gen = load_target("sglang")
    kp = gen.schema.kernel_policy_for(MOE)
    return SimpleNamespace(
        profile=gen.schema.model_profile_for(MOE),
        kp=kp,
        kp32=fp32_variant(kp),
        rp=gen.runtime_policy.policy_for(MOE, SimpleNamespace(tp_size=1)),
    )


def _hf_moe(tmp_path, name, seed=0):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=3,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        initializer_range=0.1,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        **HF_CASES[name],
    )
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:  # non-trivial norm weights
                p.add_(0.1 * torch.randn_like(p))
            elif n.endswith("mlp.gate.weight"):  # a router that actually discriminates
                p.normal_(0.0, 0.5)
    model.save_pretrained(tmp_path / name)
    return model, tmp_path / name


def _covering(profile, path):
    """The MoE profile with the test checkpoint as its one checkpoint."""
    template = dataclasses.replace(profile.reference_model, name="tiny", tp_sizes=None)
    dims = dims_from_hf_config(read_hf_config(path), template, profile.family)
    return dataclasses.replace(profile, checkpoints=(dims,))


@pytest.mark.parametrize("name", sorted(HF_CASES))
def test_hf_qwen3_moe_agreement_float32(tmp_path, moe_policy, name):
    hf, path = _hf_moe(tmp_path, name)
    arch, weights = load_checkpoint(path, _covering(moe_policy.profile, path))
    spec = arch.spec
    mlp = [next(iter(spec.layer_blocks(arch, i))) for i in range(arch.num_layers)]
    expected = ["moe", "dense_mlp", "moe"] if name.startswith("norm") else ["dense_mlp", "moe"] * 2
    assert mlp == expected[: arch.num_layers]
    assert arch.norm_topk_prob == HF_CASES[name]["norm_topk_prob"]
    eng = RolloutEngine(
        ReferenceModel(arch, weights, moe_policy.kp32, moe_policy.rp), progress=False
    )
    seq = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([seq])).logits[0]
    ours = eng.logits(seq)
    assert ours.dtype == torch.float32
    rel = (ours - ref).abs().max() / ref.abs().max()
    assert rel <= 1e-5, rel
    prompt, cur = seq[:6], list(seq[:6])
    with torch.no_grad():
        for _ in range(6):
            cur.append(int(hf(torch.tensor([cur])).logits[0, -1].argmax()))
    assert eng.generate([Request("r", tuple(prompt), 6)])["r"].tokens == cur[6:]


# ---- routing and grouping depend on the token alone (the contract's bf16 MoE policy) ---------
def _small_arch(profile):
    """The reference model's shape, smaller (test time): 2 layers (MoE, then dense by
    mlp_only_layers), 4 experts, top-2, expert down_proj K=256 (one tile per rank at TP=2)."""
    return dataclasses.replace(
        ModelArch.from_profile(profile),
        name="moe-small",
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=256,
        num_layers=2,
        num_experts=4,
        num_experts_per_tok=2,
        vocab_size=500,
        tied_router_experts=None,  # the reference model's tied rows 2 and 5: not in 4 experts
    )


MIX = [
    Request("a", tuple(range(1, 6)), 3),
    Request("b", tuple(range(20, 50)), 3, temperature=1.0, seed=3, arrival_step=1),
    Request("c", (7,), 2, arrival_step=2),
]


@pytest.fixture(scope="module")
def small(moe_policy):
    arch = _small_arch(moe_policy.profile)
    return arch, random_weights(arch, seed=0)


def test_layers_follow_the_family(small):
    arch, weights = small
    blocks = [set(arch.spec.layer_blocks(arch, i)) for i in range(arch.num_layers)]
    assert blocks == [{"moe"}, {"dense_mlp"}]  # mlp_only_layers: [1]
    assert "model.layers.1.mlp.down_proj.weight" in weights
    assert "model.layers.1.mlp.gate.weight" not in weights
    assert "model.layers.0.mlp.down_proj.weight" not in weights
    assert weights["model.layers.0.mlp.experts.3.down_proj.weight"].shape == (128, 256)
    assert weights["model.layers.0.mlp.gate.weight"].shape == (4, 128)


def test_request_alone_equals_in_a_mixed_batch(small, moe_policy):
    eng = RolloutEngine(ReferenceModel(*small, moe_policy.kp, moe_policy.rp), progress=False)
    mixed = eng.generate(MIX)
    for r in MIX:
        alone = eng.generate([dataclasses.replace(r, arrival_step=0)])[r.rid]
        assert alone.tokens == mixed[r.rid].tokens, r.rid
        assert torch.equal(alone.logprob_tensor(), mixed[r.rid].logprob_tensor()), r.rid
    # decode (one row per step) equals the prefill re-score (all rows at once)
    b = mixed["b"]
    assert torch.equal(eng.rescore(b.sequence)[len(b.prompt) - 1 :], b.logprob_tensor())


def _block_inputs(seed=0, T=6, H=128, E=8, F=256):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16)
    router = (torch.randn(E, H, generator=g) / H**0.5).to(torch.bfloat16)
    experts = [
        tuple((torch.randn(*s, generator=g) / s[1] ** 0.5).to(torch.bfloat16) for s in shapes)
        for shapes in [((F, H), (F, H), (H, F))] * E
    ]
    return x, router, experts


def _block(x, router, experts, kp, top_k=4, normalize=True):
    from contractgen.adapters.kernels.matmul import invariant_matmul
    from contractgen.adapters.kernels.mlp import silu_glu

    acc = getattr(torch, kp.matmul_accumulation_dtype)
    return moe.moe_block(
        x,
        router,
        experts,
        kp,
        top_k=top_k,
        normalize=normalize,
        act=silu_glu,
        column_linear=invariant_matmul,
        row_partial=lambda a, w, p: invariant_matmul(a, w, p, out_dtype=acc),
        all_reduce=lambda t, group: t,
    )


def test_peers_routed_to_the_same_experts_do_not_change_a_token(moe_policy):
    """Row 0 alone and with peers that are near copies of it (so they pick the same experts and
    share every expert's GEMM with it): the same bits."""
    kp = moe_policy.kp
    x, router, experts = _block_inputs()
    peers = x[:1] + 0.01 * x[1:]
    batch = torch.cat([x[:1], peers])
    _, ids = moe.route(batch, router, kp, top_k=4, normalize=True)
    assert all(set(ids[i].tolist()) == set(ids[0].tolist()) for i in range(len(batch)))
    alone = _block(x[:1], router, experts, kp)
    assert torch.equal(alone, _block(batch, router, experts, kp)[:1])
    assert torch.equal(alone, _block(torch.cat([peers, x[:1]]), router, experts, kp)[-1:])


def _tied_router(H=128, E=8):
    """Router rows: expert 3 highest, experts 2 and 5 exactly tied second, the rest lower."""
    base = torch.full((H,), 1.0 / H)
    w = torch.stack([-base * (1 + e) for e in range(E)])
    w[3], w[2], w[5] = 2 * base, base, base
    return w.to(torch.bfloat16)


def test_tied_router_logits_lowest_expert_id_wins(moe_policy):
    kp = moe_policy.kp
    x = torch.ones(3, 128, dtype=torch.bfloat16)
    router = _tied_router()
    logits = moe.router_logits(x, router, kp)
    assert logits[0, 2] == logits[0, 5] and logits[0, 3] > logits[0, 2] > logits[0, 0]
    _, ids = moe.route(x, router, kp, top_k=2, normalize=True)
    assert ids.tolist() == [[3, 2]] * 3
    highest = dataclasses.replace(kp, moe_topk_tie_break="highest_expert_id")
    assert moe.route(x, router, highest, top_k=2, normalize=True)[1].tolist() == [[3, 5]] * 3
    # and the tie decides the output: experts 2 and 5 have different FFNs
    _, _, experts = _block_inputs()
    a = _block(x, router, experts, kp, top_k=2)
    assert not torch.equal(a, _block(x, router, experts, highest, top_k=2))


def _flips():
    from contractgen.parity.faults import flipped

    kp = load_target("sglang").schema.kernel_policy_for(MOE)
    return {
        f.name: flipped(f.name, getattr(kp, f.name), "kernel")
        for f in dataclasses.fields(kp)
        if f.name.startswith("moe_")
    }


# moe_token_order cannot show (next test); moe_ep_combine acts only under expert parallelism,
# which only the trainer has (tests/megatron/test_megatron_moe_ep.py shows it read there)
@pytest.mark.parametrize("field", sorted(set(_flips()) - {"moe_token_order", "moe_ep_combine"}))
def test_every_moe_policy_field_is_read(moe_policy, field):
    """Flipping the field (to the fault catalogue's alternative) changes the block's output;
    the tie-break is exercised on tied logits."""
    kp = moe_policy.kp
    x, router, experts = _block_inputs(T=16)
    top_k = 4
    if field == "moe_topk_tie_break":  # experts 2 and 5 tied for the second of two places
        x, router, top_k = torch.ones(2, 128, dtype=torch.bfloat16), _tied_router(), 2
    if field == "moe_topk_normalisation":
        kp = fp32_variant(kp)  # the two forms differ by float32 ulps, below bf16's rounding
    flipped = dataclasses.replace(kp, **{field: _flips()[field]})
    out = _block(x, router, experts, kp, top_k=top_k)
    assert not torch.equal(out, _block(x, router, experts, flipped, top_k=top_k))


def test_token_order_is_invisible_under_the_invariant_matmul(moe_policy):
    """The contract's ``unobservable`` note: grouping tokens in any order gives the same bits."""
    kp = moe_policy.kp
    x, router, experts = _block_inputs(T=40)
    unordered = dataclasses.replace(kp, moe_token_order="unordered")
    torch.manual_seed(0)
    assert torch.equal(_block(x, router, experts, kp), _block(x, router, experts, unordered))


@pytest.mark.parametrize("field", ["moe_topk_normalisation", "moe_combine_order"])
def test_float32_ulp_fields_rarely_survive_the_bfloat16_rounding(moe_policy, field):
    """The contract's ``unobservable`` notes on these two fields: flipped, they change float32
    ulps of the combine, which rounds once to bfloat16, so in the contract's dtypes only the odd
    output changes (some, but fewer than 1 in 10,000 of 512,000), where float32 changes many."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 256, generator=g).to(torch.bfloat16)
    router = (torch.randn(8, 256, generator=g) / 16).to(torch.bfloat16)
    y_TKH = (torch.randn(2000, 4, 256, generator=g) / 2).to(torch.bfloat16)  # experts' outputs

    def changed(kp):
        flipped = dataclasses.replace(kp, **{field: _flips()[field]})
        outs = []
        for p in (kp, flipped):
            weights, ids = moe.route(x, router, p, top_k=4, normalize=True)
            outs.append(moe.combine(y_TKH, weights, ids, p))
        return int((outs[0] != outs[1]).sum())

    in_bf16, in_fp32 = changed(moe_policy.kp), changed(moe_policy.kp32)
    assert 0 < in_bf16 < 2000 * 256 // 10_000 < in_fp32, (in_bf16, in_fp32)


def test_norm_topk_prob_is_read(moe_policy):
    kp = moe_policy.kp
    x, router, experts = _block_inputs()
    w, _ = moe.route(x, router, kp, top_k=4, normalize=True)
    assert torch.allclose(w.sum(-1), torch.ones(len(x)))
    w_raw, _ = moe.route(x, router, kp, top_k=4, normalize=False)
    assert (w_raw.sum(-1) < 1).all()
    assert not torch.equal(
        _block(x, router, experts, kp), _block(x, router, experts, kp, normalize=False)
    )


@pytest.mark.slow
def test_moe_tp2_equals_tp1(small, moe_policy):
    """Experts sharded like the dense MLP (gate/up rows, down K), TP=2 over gloo: same bits."""
    import tp_helpers as tp

    arch, weights = small
    gen = load_target("sglang")
    rp2 = gen.runtime_policy.policy_for(MOE, SimpleNamespace(tp_size=2))
    got = tp.tp_rollout(2, arch, moe_policy.kp, rp2, MIX, weights=0, rescore=[list(range(5, 30))])
    eng = RolloutEngine(ReferenceModel(arch, weights, moe_policy.kp, moe_policy.rp), progress=False)
    out = eng.generate(MIX)
    for rid, c in out.items():
        assert got["completions"][rid][0] == c.tokens, rid
        assert torch.equal(got["completions"][rid][1], c.logprob_tensor()), rid
    assert torch.equal(got["rescores"][0], eng.rescore(list(range(5, 30))))


def test_generated_schema_holds_the_moe_identity():
    """The contract takes over the public placeholder: the issue's values, a fingerprint, an id in
    CONTRACT_IDS; its MoE policy and dims are in the generated dataclasses (and absent, None, on a
    dense contract, whose canonical data has no MoE keys)."""
    schema = load_target("sglang").schema
    s = schema.QWEN3_MOE_TRUE_ON_POLICY_V1_SCHEMA
    assert (
        s.name,
        s.model_family,
        s.required_kernel_contracts,
        s.logprob_contract,
        s.sglang_attention_backend,
        s.fsdp_attention_implementation,
        s.disable_megatron_sequence_parallel,
    ) == (
        "qwen3_moe_true_on_policy_v1",
        "qwen3_moe",
        ("qwen3_dense_sglang_math", "qwen3_moe_sglang_math"),
        "sglang_prefill",
        "fa3",
        "flash_attention_3",
        True,
    )
    assert MOE in schema.CONTRACT_IDS and schema.get_contract_schema(MOE) is s
    assert s.fingerprint == schema.FINGERPRINTS[MOE] and s.fingerprint.startswith("sha256:")
    kp = schema.kernel_policy_for(MOE)
    assert (kp.moe_topk_tie_break, kp.moe_combine_order, kp.moe_router_softmax_dtype) == (
        "lowest_expert_id",
        "expert_id",
        "float32",
    )
    a3b = schema.model_profile_for(MOE).checkpoint("Qwen3-30B-A3B")
    assert (a3b.num_experts, a3b.num_experts_per_tok, a3b.moe_intermediate_size) == (128, 8, 768)
    dense = "qwen3_dense_true_on_policy_v1"
    assert schema.kernel_policy_for(dense).moe_topk_tie_break is None
    assert not any("moe" in k for k in schema.CONTRACT_DATA[dense]["kernel_policy"])


# ---- the same on a CUDA device (Triton matmul via the registry; skipped without one) ----------
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_moe_block_row_invariant_and_reads_its_fields(moe_policy, dtype):
    kp = moe_policy.kp if dtype == "bfloat16" else moe_policy.kp32
    x, router, experts = _block_inputs(T=70)
    x, router = x.cuda().to(getattr(torch, dtype)), router.cuda()
    experts = [tuple(w.cuda() for w in e) for e in experts]
    full = _block(x, router, experts, kp)
    assert full.is_cuda
    for rows in (slice(0, 1), slice(5, 6), slice(3, 40)):
        assert torch.equal(_block(x[rows], router, experts, kp), full[rows]), rows
    unordered = dataclasses.replace(kp, moe_token_order="unordered")
    assert torch.equal(_block(x, router, experts, unordered), full)
    if dtype == "float32":
        # In bfloat16 the float32 combine of 4 experts is rounded once to bf16, and on these
        # inputs no element's rounding depends on the order (seen on the H200): the order is
        # observable only where the output keeps float32 bits.
        flipped = dataclasses.replace(kp, moe_combine_order="topk_rank")
        assert not torch.equal(_block(x, router, experts, flipped), full)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_request_alone_equals_in_a_mixed_batch(small, moe_policy):
    arch, weights = small
    model = ReferenceModel(arch, weights, moe_policy.kp, moe_policy.rp, device="cuda")
    eng = RolloutEngine(model, progress=False)
    mixed = eng.generate(MIX)
    for r in MIX:
        alone = eng.generate([dataclasses.replace(r, arrival_step=0)])[r.rid]
        assert alone.tokens == mixed[r.rid].tokens, r.rid
        assert torch.equal(alone.logprob_tensor(), mixed[r.rid].logprob_tensor()), r.rid
    b = mixed["b"]
    assert torch.equal(eng.rescore(b.sequence)[len(b.prompt) - 1 :], b.logprob_tensor())
