"""Build the FSDP trainer's model: transformers' own class for the family, the gate's weights
loaded, the contract's ops attached (``attach``), sharded with FSDP2 (``shard``).

``attach`` is a lookup, never a branch on the family: which modules a model has comes from
transformers' own structure (``get_input_embeddings``, ``model.layers[i].self_attn`` …, the
conventions Qwen3, Llama and Qwen3-MoE share), which linears are row-parallel from the family's
weight table (``shard == "row"``), and which MLP block a layer has from the family's
``layer_blocks`` (``MLP_BLOCKS``). Which ops are the contract's comes from the runtime policy,
resolved once (``policy.FsdpPolicy``): ``enabled`` (the attention block and RoPE),
``batch_invariant_mode`` (linears, norms, MLP, embedding, LM head) and ``attn_implementation``
(the attention function, by name, through transformers' registry).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import transformers
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from ..common.model import hf_config_keys
from ..families import LAYER_PREFIX
from ..kernels.policy import KernelPolicy
from . import ops
from .policy import FsdpPolicy


def hf_config(arch: Any) -> Any:
    """transformers' config for ``arch`` (a rollout ``ModelArch``), of the family's class."""
    keys = hf_config_keys(arch.spec) | {"norm_eps": "rms_norm_eps"}  # eps: the profile's
    given = {k: getattr(arch, f) for f, k in keys.items() if getattr(arch, f) is not None}
    given = {k: list(v) if isinstance(v, tuple) else v for k, v in given.items()}
    rope = dict(arch.rope_scaling or ())
    rope = {"rope_type": rope.pop("type", None) or rope.pop("rope_type", "default"), **rope}
    rope["rope_theta"] = arch.rope_theta
    cls = getattr(transformers, arch.spec.hf_architectures[0])
    return cls.config_class(**given, rope_parameters=rope, attention_bias=False)


def to_model_layout(model: nn.Module, weights: Mapping[str, torch.Tensor]) -> dict:
    """Checkpoint names -> the model's own: transformers 5 stacks a layer's routed experts
    (``mlp.experts.gate_up_proj`` ``[E, 2F, H]``: gate rows, then up; ``mlp.experts.down_proj``
    ``[E, H, F]``), where checkpoints keep ``mlp.experts.{e}.{gate,up,down}_proj.weight``."""
    own = model.state_dict()
    out = dict(weights)
    for i in range(model.config.num_hidden_layers):
        prefix = LAYER_PREFIX.format(i=i) + "mlp.experts."
        if prefix + "gate_up_proj" not in own:
            continue
        n = model.config.num_experts
        per = {r: [out.pop(f"{prefix}{e}.{r}_proj.weight") for e in range(n)] for r in _PROJ}
        out[prefix + "gate_up_proj"] = torch.stack(
            [torch.cat([g, u]) for g, u in zip(per["gate"], per["up"], strict=True)]
        )
        out[prefix + "down_proj"] = torch.stack(per["down"])
    return out


def to_checkpoint_layout(model: nn.Module, state: Mapping[str, torch.Tensor]) -> dict:
    """Inverse of ``to_model_layout`` (what the rollout loads), a tied head left out."""
    out = dict(state)
    for name in [n for n in out if n.endswith("mlp.experts.gate_up_proj")]:
        prefix = name[: -len("gate_up_proj")]
        gate_up, down = out.pop(name), out.pop(prefix + "down_proj")
        f = down.shape[-1]
        for e in range(gate_up.shape[0]):
            out[f"{prefix}{e}.gate_proj.weight"] = gate_up[e, :f]
            out[f"{prefix}{e}.up_proj.weight"] = gate_up[e, f:]
            out[f"{prefix}{e}.down_proj.weight"] = down[e]
    if model.config.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


_PROJ = ("gate", "up", "down")


def build(arch: Any, weights: Mapping[str, torch.Tensor], policy: FsdpPolicy, group: Any):
    """transformers' model for ``arch`` holding ``weights`` (HF names) in the policy's master
    dtype, with the contract's ops attached (``attach``; ``group``: this rank alone, where the
    kernels' cross-rank reductions run)."""
    ops.register_attention()
    cls = getattr(transformers, arch.spec.hf_architectures[0])
    torch.manual_seed(0)
    model = cls(hf_config(arch))
    missing, unexpected = model.load_state_dict(to_model_layout(model, weights), strict=False)
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    if unexpected or not set(missing) <= tied:
        raise RuntimeError(f"weights do not fit {cls.__name__}: {missing=} {unexpected=}")
    model = model.to(policy.master_dtype)
    attach(model, arch, policy, group)
    return model


def _row_linears(arch: Any) -> frozenset[str]:
    """Module paths (inside a decoder layer) of the family's row-parallel linears."""
    return frozenset(
        w.hf_name.removesuffix(".weight")
        for w in arch.spec.layer_weights.values()
        if w.shard == "row" and not w.per_expert
    )


def _set(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


def _attach_linears(layer: nn.Module, policy: FsdpPolicy, rows: frozenset[str], group) -> None:
    for path, m in list(layer.named_modules()):
        if isinstance(m, nn.Linear) and not path.endswith("mlp.gate"):
            if m.bias is not None:
                raise ValueError(f"{path}: a linear with a bias is not in any contract")
            _set(layer, path, ops.ContractLinear(m.weight, policy.kp, path in rows, group))


def _norm(m: nn.Module, kp: KernelPolicy, output: str) -> ops.ContractRMSNorm:
    return ops.ContractRMSNorm(m.weight, m.variance_epsilon, kp, output)


def _dense_mlp(mlp: nn.Module, policy: FsdpPolicy, group: Any) -> nn.Module:
    return ops.ContractMLP(mlp, policy.kp)


def _moe(mlp: nn.Module, policy: FsdpPolicy, group: Any) -> nn.Module:
    return ops.ContractMoE(mlp, policy.kp, group)


# a layer's MLP block (``Family.layer_blocks``) -> its contract module
MLP_BLOCKS: dict[str, Callable[[nn.Module, FsdpPolicy, Any], nn.Module]] = {
    "dense_mlp": _dense_mlp,
    "moe": _moe,
}


def attach(model: nn.Module, arch: Any, policy: FsdpPolicy, group: Any) -> None:
    """Put the contract's ops into ``model`` in place, as ``policy`` says (module docstring)."""
    rp, kp = policy.rp, policy.kp
    model.config._attn_implementation = rp.attn_implementation or "sdpa"
    if not rp.enabled:
        return  # stock transformers (with the attention function it names)
    base = model.model
    base.rotary_emb = ops.ContractRotary(
        arch.head_dim, arch.rope_theta, arch.rope_scaling, arch.max_position_embeddings, kp
    )
    rows = _row_linears(arch)
    for i, layer in enumerate(base.layers):
        layer.self_attn = ops.ContractAttention(layer.self_attn, kp)
        if not rp.batch_invariant_mode:
            continue
        (block,) = arch.spec.layer_blocks(arch, i)
        layer.mlp = MLP_BLOCKS[block](layer.mlp, policy, group)
        _attach_linears(layer, policy, rows, group)
        layer.input_layernorm = _norm(layer.input_layernorm, kp, "dense")
        layer.post_attention_layernorm = _norm(layer.post_attention_layernorm, kp, "dense")
        for name in ("q_norm", "k_norm"):
            if getattr(layer.self_attn, name) is not None:
                setattr(layer.self_attn, name, _norm(getattr(layer.self_attn, name), kp, "keep"))
    if not rp.batch_invariant_mode:
        return
    base.embed_tokens = ops.ContractEmbedding(base.embed_tokens.weight, kp)
    base.norm = _norm(base.norm, kp, "keep")
    model.lm_head = ops.ContractLMHead(model.lm_head.weight, kp)


def shard(model: nn.Module, policy: FsdpPolicy, mesh: Any) -> nn.Module:
    """FSDP2: each decoder layer its own unit, then the root (embedding, final norm, LM head:
    a tied head shares the embedding's parameter in one unit). Parameters are gathered in
    ``policy.param_dtype`` and gradients reduced in ``policy.reduce_dtype`` by FSDP's own
    ``MixedPrecisionPolicy``; forward inputs are not cast (``cast_forward_inputs=False``): the
    residual stream and the RoPE table keep the contract's dtypes across unit boundaries."""
    mp = MixedPrecisionPolicy(
        param_dtype=policy.param_dtype,
        reduce_dtype=policy.reduce_dtype,
        cast_forward_inputs=False,
    )
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model
