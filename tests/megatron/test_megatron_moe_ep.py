"""Issue 13, expert parallelism on the trainer: megatron-core's expert groups
(``expert_model_parallel_size``, expert TP 1), each rank holding ``E / EP`` whole experts, and the
dispatcher exchanging tokens and outputs through ``kernels.moe.ep_gather_tokens`` /
``ep_combine``. EP layouts score the same bits as TP1 (the gate shows it under the contract's
dtypes, ``tests/parity/test_moe_gate.py``); here, under float32 dtypes, where the float32 fold is
not rounded away, ``moe_ep_combine`` is shown to be read: ``sum_partials`` moves the logprobs,
``gather_slots`` does not."""

from __future__ import annotations

import pytest
import torch

from contractgen.adapters.common.layout import Layout
from contractgen.adapters.common.run_types import TrainerFault, TrainerRun
from contractgen.adapters.megatron.checkpoint import _moe_to_megatron
from contractgen.adapters.megatron.trainer import TrainerSession, trainer_logprobs_runs
from contractgen.adapters.sglang.model import ModelArch, random_weights
from contractgen.codegen.vendored import load_target

MOE = "qwen3_moe_true_on_policy_v2"


@pytest.fixture(scope="module")
def arch():
    return ModelArch.from_profile(load_target("sglang").schema.model_profile_for(MOE))


@pytest.fixture(scope="module")
def weights(arch):
    return random_weights(arch, seed=0)


def _sequences(n: int, length: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 1000, (length - 7 * i,), generator=g).tolist() for i in range(n)]


def _equal(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_ep_combine_is_read_under_float32(weights):
    """float32 dtypes: ep2 (two attention-DP ranks) and tp2ep2 equal tp1 bit for bit;
    ``moe_ep_combine: sum_partials`` on the EP trainer alone moves its logprobs."""
    seqs = _sequences(4, 60)
    f32 = TrainerRun(dtype_override="float32")
    partials = TrainerRun(
        dtype_override="float32",
        fault=TrainerFault(kernel_policy={"moe_ep_combine": "sum_partials"}),
    )
    (base,) = trainer_logprobs_runs(MOE, weights, seqs, Layout(), [f32])
    for layout in (Layout(ep=2), Layout(tp=2, ep=2)):
        same, moved = trainer_logprobs_runs(MOE, weights, seqs, layout, [f32, partials])
        assert _equal(same.logprobs, base.logprobs), layout.name
        assert not _equal(moved.logprobs, base.logprobs), layout.name
        assert [t.shape for t in moved.logprobs] == [t.shape for t in base.logprobs]


def test_ep_layouts_refuse_gradients_and_too_few_sequences(weights):
    """The EP exchange has no backward: a gradient run says so; an EP layout that adds
    data-parallel ranks needs a sequence per rank."""
    with TrainerSession(MOE, weights, Layout(ep=2)) as session:
        with pytest.raises(RuntimeError, match="runs the forward only"):
            session.logprobs(_sequences(2, 30), TrainerRun(grads=True))
        with pytest.raises(RuntimeError, match="give at least 2 sequences"):
            session.logprobs(_sequences(1, 30))


def test_an_ep_rank_loads_its_own_experts_whole(arch, weights):
    """EP rank 1 of 2 holds global experts 4..7 as its local 0..3, unsplit (expert TP 1)."""
    src = "model.layers.0."
    got = dict(_moe_to_megatron(weights, src, arch, 0, 2, ep=(1, 2)))
    assert sorted(k for k in got if k.endswith("linear_fc2.weight")) == [
        f"mlp.experts.local_experts.{e}.linear_fc2.weight" for e in range(4)
    ]
    for local in range(4):
        e = 4 + local
        fc1 = got[f"mlp.experts.local_experts.{local}.linear_fc1.weight"]
        gate = weights[f"{src}mlp.experts.{e}.gate_proj.weight"]
        up = weights[f"{src}mlp.experts.{e}.up_proj.weight"]
        assert torch.equal(fc1, torch.cat([gate, up]))
        down = got[f"mlp.experts.local_experts.{local}.linear_fc2.weight"]
        assert torch.equal(down, weights[f"{src}mlp.experts.{e}.down_proj.weight"])
    assert torch.equal(got["mlp.router.weight"], weights[f"{src}mlp.gate.weight"])


def test_the_gradient_check_reports_ep_layouts_as_not_supported():
    """``parity --grads`` at an EP layout: an entry saying why, no trainer run."""
    from contractgen.parity.correctness import layout_grads

    entry = layout_grads(None, None, Layout(tp=2, ep=2))
    assert entry["supported"] is False and entry["name"] == "tp2ep2"
    assert entry["note"].startswith("not supported: expert parallelism runs the forward only")


def test_layer_dumps_at_ep2_cover_every_sequence_and_equal_tp1(weights):
    """What ``first_divergence`` asks for at a diverging layout: under the attention DP that ep2
    adds, a dumping run scores every sequence on every DP rank and answers from DP rank 0."""
    from contractgen.adapters.megatron.trainer import trainer_logprobs

    seqs = _sequences(3, 30)
    tp1 = trainer_logprobs(MOE, weights, seqs, Layout(), dump_layers=True)
    ep2 = trainer_logprobs(MOE, weights, seqs, Layout(ep=2), dump_layers=True)
    assert _equal(ep2.logprobs, tp1.logprobs)
    assert len(ep2.layer_dumps) == len(seqs)
    for a, b in zip(ep2.layer_dumps, tp1.layer_dumps, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
