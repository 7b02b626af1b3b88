"""The Megatron trainer's policy is resolved once, when its config is made: building the model
looks nothing up again, and every layer holds that one typed ``KernelPolicy`` and runtime policy
(the QK norms a derived copy; routed experts a deep copy, as megatron copies their config). A config made with a runtime change carries it to the layers."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from megatron_reference import tiny_arch
from megatron_testing import single_process_megatron

from contractgen.adapters.kernels import KernelPolicy
from contractgen.adapters.megatron import policy as policy_mod
from contractgen.adapters.megatron.layers import SGLangQKRMSNorm
from contractgen.adapters.megatron.model import Layout, build_model, make_config, padded_vocab_size

V1 = "qwen3_dense_true_on_policy_v1"
MOE = "qwen3_moe_true_on_policy_v1"


@pytest.fixture(scope="module", autouse=True)
def megatron_world():
    with single_process_megatron():
        yield


def _policy_holders(model):
    return [m for m in model.modules() if hasattr(m, "kernel_policy")]


@pytest.mark.parametrize("contract", [V1, MOE])
def test_building_the_model_resolves_nothing_again(contract, monkeypatch):
    arch = tiny_arch(contract, num_layers=2)
    config = make_config(contract, arch, Layout())
    calls = []
    resolve = policy_mod.resolve
    monkeypatch.setattr(policy_mod, "resolve", lambda c: calls.append(c) or resolve(c))
    gen = policy_mod.generated()
    for name in ("kernel_policy_for", "policy_for"):
        module = gen.schema if name == "kernel_policy_for" else gen.runtime_policy
        real = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *a, _real=real, **k: calls.append(a) or _real(*a, **k)
        )
    torch.manual_seed(0)
    model = build_model(config, arch, pre_process=True, post_process=True,
                        padded_vocab_size=padded_vocab_size(arch, 1, config.true_on_policy.kp))  # fmt: skip
    assert calls == []
    holders = _policy_holders(model)
    assert len(holders) > 10
    kp = config.true_on_policy.kp
    assert isinstance(kp, KernelPolicy)
    for m in holders:
        if isinstance(m, SGLangQKRMSNorm):
            cast = m.kernel_policy.norm_cast_before_weight
            assert m.kernel_policy == dataclasses.replace(kp, norm_cast_before_weight=cast)
        else:  # megatron deep-copies the config for routed experts: a copy, not a lookup
            assert m.kernel_policy == kp, type(m).__name__


def test_the_twin_resolution_is_counted(monkeypatch):
    """The counter above sees a resolution where one happens: making a config."""
    calls = []
    gen = policy_mod.generated()
    real = gen.schema.kernel_policy_for
    monkeypatch.setattr(gen.schema, "kernel_policy_for", lambda *a: calls.append(a) or real(*a))
    make_config(V1, tiny_arch(V1, num_layers=2), Layout())
    assert calls


def test_a_runtime_change_reaches_every_layer():
    arch = tiny_arch(V1, num_layers=2)
    base = make_config(V1, arch, Layout())
    changed = make_config(V1, arch, Layout(), runtime_changes={"disable_rope_fusion": False})
    assert base.true_on_policy.rp.disable_rope_fusion is True
    assert changed.true_on_policy.rp.disable_rope_fusion is False
    torch.manual_seed(0)
    model = build_model(changed, arch, pre_process=True, post_process=True,
                        padded_vocab_size=padded_vocab_size(arch, 1, changed.true_on_policy.kp))  # fmt: skip
    held = [m.runtime_policy for m in model.modules() if hasattr(m, "runtime_policy")]
    assert held and all(rp is changed.true_on_policy.rp for rp in held)
