"""Hugging Face weights (names from the model family) -> one megatron-core model stage, per TP rank.

The same HF-named weights the rollout loads (``model.load_checkpoint`` reads a checkpoint directory
with the rollout's own reader; the default gate passes the rollout's in-memory random weights). Layouts: megatron's fused ``linear_qkv`` is, per query group,
``[q heads of the group; k; v]``, and a TP rank holds a contiguous run of whole groups;
``linear_fc1`` is ``[gate shard; up shard]`` per rank; row-parallel weights split K; the
vocabulary is zero-padded (``ModelShape.padded_vocab_size``) then split by rows. An MoE layer
(``Family.layer_blocks``) has megatron's ``mlp.router.weight`` (replicated) and per expert
``mlp.experts.local_experts.{e}.linear_fc1/linear_fc2``, sharded as the dense MLP at EP 1;
under EP > 1 a rank holds experts ``ep_rank * E/EP ...`` whole (expert TP 1, megatron's
``expert_tensor_parallel_size=1``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping

import torch

from contractgen.adapters.common.model import ModelArch
from contractgen.adapters.families import LAYER_PREFIX


def _rows(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return torch.chunk(t, size, dim=0)[rank]


def _cols(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return torch.chunk(t, size, dim=1)[rank]


def output_gate(arch: ModelArch) -> bool:
    """Whether the family's ``q_proj`` holds each head's output-gate rows after its query rows
    (megatron's ``attention_output_gate``)."""
    hybrid = arch.spec.hybrid
    return hybrid is not None and "attention_output_gate" in hybrid.extras


def fused_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: ModelArch) -> torch.Tensor:
    """HF q/k/v projections -> megatron's per-query-group ``[q...; k; v]`` layout, or with the
    output gate ``[q...; gate...; k; v]`` (HF's ``q_proj`` holds per head its query rows, then
    its gate rows)."""
    ng, d = arch.num_kv_heads, arch.head_dim
    per = arch.num_attention_heads // ng
    k = k.reshape(ng, d, -1)
    v = v.reshape(ng, d, -1)
    if output_gate(arch):
        qg = q.reshape(ng, per, 2, d, -1)
        q_parts = [qg[:, :, 0].reshape(ng, per * d, -1), qg[:, :, 1].reshape(ng, per * d, -1)]
    else:
        q_parts = [q.reshape(ng, per * d, -1)]
    return torch.cat([*q_parts, k, v], dim=1).reshape(-1, k.shape[-1])


def _fc1_fc2(gate, up, down, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One SwiGLU MLP's HF gate/up/down -> this rank's ``linear_fc1`` ([gate shard; up shard])
    and ``linear_fc2`` (down's K shard)."""
    fc1 = torch.cat([_rows(gate, rank, size), _rows(up, rank, size)], dim=0)
    return fc1, _cols(down, rank, size)


def _dense_mlp_to_megatron(hf, src: str, arch: ModelArch, rank: int, size: int, ep=(0, 1)):
    w = {role: hf[src + x.hf_name] for role, x in arch.spec.layer_weights.items() if role in _MLP}
    fc1, fc2 = _fc1_fc2(w["gate"], w["up"], w["down"], rank, size)
    return [("mlp.linear_fc1.weight", fc1), ("mlp.linear_fc2.weight", fc2)]


def _moe_to_megatron(hf, src: str, arch: ModelArch, rank: int, size: int, ep=(0, 1)):
    """Router (replicated) -> ``mlp.router.weight``; this EP rank's experts (``ep``: ``(rank,
    size)``) -> megatron's ``mlp.experts.local_experts.{local}.linear_fc1/linear_fc2``: sharded
    as the dense MLP at EP 1, whole under EP > 1."""
    names = {role: x.hf_name for role, x in arch.spec.layer_weights.items()}
    out = [("mlp.router.weight", hf[src + names["router"]])]
    ep_rank, ep_size = ep
    per_rank = arch.num_experts // ep_size
    if ep_size > 1:
        rank, size = 0, 1
    for local in range(per_rank):
        e = ep_rank * per_rank + local
        gate, up, down = (hf[src + names[f"expert_{r}"].format(e=e)] for r in _MLP)
        fc1, fc2 = _fc1_fc2(gate, up, down, rank, size)
        out += [(_EXPERT.format(e=local) + "linear_fc1.weight", fc1)]
        out += [(_EXPERT.format(e=local) + "linear_fc2.weight", fc2)]
    if _SHARED[0] in names:  # the family's shared expert: megatron's ``SharedExpertMLP``
        gate, up, down, gate_w = (hf[src + names[r]] for r in _SHARED)
        fc1, fc2 = _fc1_fc2(gate, up, down, rank, size)
        out += [(_SHARED_PREFIX + "linear_fc1.weight", fc1)]
        out += [
            (_SHARED_PREFIX + "linear_fc2.weight", fc2),
            (_SHARED_PREFIX + "gate_weight", gate_w),
        ]
    return out


_MLP = ("gate", "up", "down")
_EXPERT = "mlp.experts.local_experts.{e}."
_SHARED = ("shared_gate", "shared_up", "shared_down", "shared_expert_gate")  # family roles
_SHARED_PREFIX = "mlp.shared_experts."

# a layer's MLP block (``Family.layer_blocks``) -> its megatron (name, this rank's shard) pairs
MLP_TO_MEGATRON = {"dense_mlp": _dense_mlp_to_megatron, "moe": _moe_to_megatron}


def _vocab_shard(t: torch.Tensor, padded: int, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s rows of ``t`` zero-padded to ``padded`` rows and split in ``size``: a view
    when the shard holds no padding (only this shard is ever padded, never the whole vocab)."""
    per = padded // size
    lo, hi = rank * per, (rank + 1) * per
    if hi <= t.shape[0]:
        return t[lo:hi]
    out = t.new_zeros((per, *t.shape[1:]))
    real = t[lo : t.shape[0]]
    out[: real.shape[0]] = real
    return out


def stage_tensors(
    hf: Mapping[str, torch.Tensor],
    arch: ModelArch,
    model: torch.nn.Module,
    *,
    tp_rank: int,
    tp_size: int,
    padded_vocab_size: int,
    ep: tuple[int, int] = (0, 1),
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(megatron name, this rank's tensor)`` for every parameter of ``model`` (one pipeline
    stage at one TP rank and one EP rank: ``ep`` is ``(rank, size)``), each built only when it
    is reached (a fused or padded copy lives until the caller drops it), then a ``KeyError`` if
    the HF weights did not cover every parameter."""
    wanted = {k for k in model.state_dict() if not k.endswith("_extra_state")}
    done: set[str] = set()
    spec = arch.spec
    g = {role: w.hf_name for role, w in spec.model_weights.items()}

    def pick(named: list[tuple[str, Callable[[], torch.Tensor]]]):
        for name, value in named:
            if name in wanted:
                done.add(name)
                yield name, value()

    def vocab(hf_name: str) -> Callable[[], torch.Tensor]:
        return lambda: _vocab_shard(hf[hf_name], padded_vocab_size, tp_rank, tp_size)

    head = g["lm_head"] if g["lm_head"] in hf else g["embed"]
    yield from pick([
        ("embedding.word_embeddings.weight", vocab(g["embed"])),
        ("output_layer.weight", vocab(head)),
        ("decoder.final_layernorm.weight", lambda: hf[g["final_norm"]]),
    ])  # fmt: skip

    layers = getattr(model.decoder, "layers", [])
    for local, layer in enumerate(layers):
        i = layer.layer_number - 1  # global, 0-based
        src = LAYER_PREFIX.format(i=i)
        w = {role: src + spec.hf_name for role, spec in spec.layer_weights.items()}
        dst = f"decoder.layers.{local}."
        mixer = MIXER_TO_MEGATRON[spec.mixer(arch, i)]
        names = [(dst + name, fn) for name, fn in mixer(hf, w, arch, tp_rank, tp_size)]
        names += [
            (dst + "input_layernorm.weight", lambda w=w: hf[w["input_norm"]]),
            (dst + "pre_mlp_layernorm.weight", lambda w=w: hf[w["post_norm"]]),
        ]
        yield from pick(names)
        (block,) = spec.layer_blocks(arch, i) & MLP_TO_MEGATRON.keys()
        for name, value in MLP_TO_MEGATRON[block](hf, src, arch, tp_rank, tp_size, ep):
            yield from pick([(dst + name, lambda value=value: value)])

    missing = sorted(wanted - done)
    if missing:
        raise KeyError(f"HF weights do not cover megatron parameters: {missing[:8]}")


def megatron_stage_state_dict(
    hf: Mapping[str, torch.Tensor],
    arch: ModelArch,
    model: torch.nn.Module,
    *,
    tp_rank: int,
    tp_size: int,
    padded_vocab_size: int,
    ep: tuple[int, int] = (0, 1),
) -> dict[str, torch.Tensor]:
    """The state dict (megatron names) of ``model``, one pipeline stage at one TP rank (and
    one EP rank: ``ep`` is ``(rank, size)``): ``stage_tensors`` collected."""
    return dict(
        stage_tensors(
            hf,
            arch,
            model,
            tp_rank=tp_rank,
            tp_size=tp_size,
            padded_vocab_size=padded_vocab_size,
            ep=ep,
        )
    )


def load_into(
    model: torch.nn.Module,
    hf: Mapping[str, torch.Tensor],
    arch: ModelArch,
    *,
    tp_rank: int,
    tp_size: int,
    padded_vocab_size: int,
    ep: tuple[int, int] = (0, 1),
) -> None:
    """Copy HF weights into ``model`` (dtype of the model's parameters), one tensor at a time
    (``stage_tensors``): no whole state dict of fused / padded copies is ever held."""
    params = model.state_dict()
    tensors = stage_tensors(
        hf, arch, model, tp_rank=tp_rank, tp_size=tp_size, padded_vocab_size=padded_vocab_size,
        ep=ep,
    )  # fmt: skip
    with torch.no_grad():
        for name, value in tensors:
            target = params[name]
            if tuple(target.shape) != tuple(value.shape):
                raise ValueError(
                    f"{name}: HF weight shape {tuple(value.shape)} != megatron {tuple(target.shape)}"
                )
            target.copy_(value)
            del value


def split_qkv(
    qkv: torch.Tensor, arch: ModelArch
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Megatron's per-query-group ``[q...; (gate...;) k; v]`` rows -> HF q/k/v (inverse of
    ``fused_qkv``; with the output gate, HF's ``q_proj`` interleaves each head's gate rows)."""
    ng, d = arch.num_kv_heads, arch.head_dim
    per = arch.num_attention_heads // ng
    nq = 2 * per if output_gate(arch) else per
    g = qkv.reshape(ng, (nq + 2) * d, -1)
    q = g[:, : nq * d]
    if output_gate(arch):  # [ng, (q heads; gate heads)] -> per head (q; gate)
        q = q.reshape(ng, 2, per, d, -1).transpose(1, 2)
    q = q.reshape(ng * nq * d, -1)
    k = g[:, nq * d : (nq + 1) * d].reshape(ng * d, -1)
    v = g[:, (nq + 1) * d :].reshape(ng * d, -1)
    return q.contiguous(), k.contiguous(), v.contiguous()


def hf_state_from_stage(
    full: Mapping[str, torch.Tensor],
    arch: ModelArch,
    layer_numbers: Mapping[int, int],
    *,
    tp_size: int,
) -> dict[str, torch.Tensor]:
    """HF-named weights of one pipeline stage (inverse of ``megatron_stage_state_dict``).

    ``full``: the stage's megatron-named parameters with every TP shard concatenated in rank
    order along its partition dim (so ``linear_fc1`` is ``[gate_0; up_0; gate_1; up_1; …]`` and
    the vocab rows still carry the padding). ``layer_numbers``: local layer index -> global
    0-based index. Tensors are moved, never converted: the trainer's storage dtype is kept.
    """
    spec = arch.spec
    g = {role: w.hf_name for role, w in spec.model_weights.items()}
    out: dict[str, torch.Tensor] = {}
    V = arch.vocab_size
    if "embedding.word_embeddings.weight" in full:
        out[g["embed"]] = full["embedding.word_embeddings.weight"][:V]
    if "output_layer.weight" in full and not arch.tie_word_embeddings:
        out[g["lm_head"]] = full["output_layer.weight"][:V]
    if "decoder.final_layernorm.weight" in full:
        out[g["final_norm"]] = full["decoder.final_layernorm.weight"]
    names = {role: w.hf_name for role, w in spec.layer_weights.items()}
    for local, i in sorted(layer_numbers.items()):
        src, dst = f"decoder.layers.{local}.", LAYER_PREFIX.format(i=i)
        layer = MIXER_FROM_MEGATRON[spec.mixer(arch, i)](full, src, arch, tp_size)
        layer["input_norm"] = full[src + "input_layernorm.weight"]
        layer["post_norm"] = full[src + "pre_mlp_layernorm.weight"]
        for role, value in layer.items():
            out[dst + names[role]] = value
        (block,) = spec.layer_blocks(arch, i) & MLP_FROM_MEGATRON.keys()
        for name, value in MLP_FROM_MEGATRON[block](full, src, arch, tp_size):
            out[dst + name] = value
    return out


def _gate_up_down(full, prefix: str, width: int, tp_size: int):
    """``linear_fc1`` ([gate_0; up_0; gate_1; up_1; …]) and ``linear_fc2`` -> HF gate, up, down."""
    parts = torch.chunk(full[prefix + "linear_fc1.weight"], tp_size, dim=0)
    half = width // tp_size
    gate = torch.cat([p[:half] for p in parts])
    up = torch.cat([p[half:] for p in parts])
    return gate, up, full[prefix + "linear_fc2.weight"]


def _dense_mlp_from_megatron(full, src: str, arch: ModelArch, tp_size: int):
    names = {role: w.hf_name for role, w in arch.spec.layer_weights.items()}
    tensors = _gate_up_down(full, src + "mlp.", arch.intermediate_size, tp_size)
    return [(names[role], t) for role, t in zip(_MLP, tensors, strict=True)]


def _moe_from_megatron(full, src: str, arch: ModelArch, tp_size: int):
    names = {role: w.hf_name for role, w in arch.spec.layer_weights.items()}
    out = [(names["router"], full[src + "mlp.router.weight"])]
    for e in range(arch.num_experts):
        prefix = src + _EXPERT.format(e=e)
        tensors = _gate_up_down(full, prefix, arch.moe_intermediate_size, tp_size)
        out += [
            (names[f"expert_{role}"].format(e=e), t) for role, t in zip(_MLP, tensors, strict=True)
        ]
    if _SHARED[0] in names:
        width = arch.shared_expert_intermediate_size
        tensors = _gate_up_down(full, src + _SHARED_PREFIX, width, tp_size)
        tensors += (full[src + _SHARED_PREFIX + "gate_weight"],)
        out += [(names[role], t) for role, t in zip(_SHARED, tensors, strict=True)]
    return out


# a layer's MLP block -> its HF (name, full tensor) pairs from the TP-concatenated megatron stage
MLP_FROM_MEGATRON = {"dense_mlp": _dense_mlp_from_megatron, "moe": _moe_from_megatron}


# ---------------------------------------------------------------------------------------------
# Token mixers (``Family.mixer``): full attention and linear attention, both directions.
# ---------------------------------------------------------------------------------------------


def _full_attention_to_megatron(hf, w: dict[str, str], arch: ModelArch, rank: int, size: int):
    """megatron's fused ``linear_qkv`` (whole query groups per rank), ``linear_proj``'s K shard,
    QK-norm weights."""
    out = [
        ("self_attention.linear_qkv.weight",
         lambda: _rows(fused_qkv(hf[w["q"]], hf[w["k"]], hf[w["v"]], arch), rank, size)),
        ("self_attention.linear_proj.weight", lambda: _cols(hf[w["o"]], rank, size)),
    ]  # fmt: skip
    if arch.qk_norm:
        out += [
            ("self_attention.q_layernorm.weight", lambda: hf[w["q_norm"]]),
            ("self_attention.k_layernorm.weight", lambda: hf[w["k_norm"]]),
        ]
    return out


def _full_attention_from_megatron(full, src: str, arch: ModelArch, tp_size: int):
    q, k, v = split_qkv(full[src + "self_attention.linear_qkv.weight"], arch)
    layer = {"q": q, "k": k, "v": v, "o": full[src + "self_attention.linear_proj.weight"]}
    if arch.qk_norm:
        layer["q_norm"] = full[src + "self_attention.q_layernorm.weight"]
        layer["k_norm"] = full[src + "self_attention.k_layernorm.weight"]
    return layer


# linear-attention weight role (the family's) -> its parameter in ``SGLangGatedDeltaNet``
LINEAR_ATTENTION_PARAMS = {
    "qkvz": "self_attention.in_proj_qkvz.weight",
    "ba": "self_attention.in_proj_ba.weight",
    "conv": "self_attention.conv1d.weight",
    "dt_bias": "self_attention.dt_bias",
    "A_log": "self_attention.A_log",
    "linear_norm": "self_attention.out_norm.weight",
    "out_proj": "self_attention.out_proj.weight",
}


def _parts_shard(t: torch.Tensor, *, parts, rank: int, size: int) -> torch.Tensor:
    """This rank's rows of each concatenated part of ``t`` (``parts``: row counts), joined."""
    return torch.cat([_rows(c, rank, size) for c in t.split(list(parts))])


def _parts_whole(t: torch.Tensor, parts, size: int) -> torch.Tensor:
    """Inverse of ``_parts_shard`` over the rank-order concatenation of every rank's shard."""
    pieces = [c.split([n // size for n in parts]) for c in torch.chunk(t, size, dim=0)]
    return torch.cat([torch.cat([p[j] for p in pieces]) for j in range(len(parts))])


def _linear_attention_to_megatron(hf, w: dict[str, str], arch: ModelArch, rank: int, size: int):
    """Each Gated DeltaNet weight sharded as the family's ``Weight`` says (column: rows, whole
    key-head groups; row: K; a conv over parts: each part's rows; replicated: whole)."""
    out = []
    for role, name in LINEAR_ATTENTION_PARAMS.items():
        spec = arch.spec.layer_weights[role]
        if spec.parts is not None:
            shard = functools.partial(_parts_shard, parts=spec.parts(arch), rank=rank, size=size)
        else:
            shard = functools.partial(_SHARD_BY_KIND[spec.shard], rank=rank, size=size)
        out.append((name, functools.partial(_shard_of, shard, hf, w[role])))
    return out


def _shard_of(shard: Callable[..., torch.Tensor], hf, name: str) -> torch.Tensor:
    return shard(hf[name])


def _linear_attention_from_megatron(full, src: str, arch: ModelArch, tp_size: int):
    """The inverse: TP shards arrive concatenated along each parameter's partition dim, which
    is the whole tensor but for the conv's parts."""
    layer = {}
    for role, name in LINEAR_ATTENTION_PARAMS.items():
        spec, t = arch.spec.layer_weights[role], full[src + name]
        layer[role] = t if spec.parts is None else _parts_whole(t, spec.parts(arch), tp_size)
    return layer


def _whole(t: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    return t


_SHARD_BY_KIND = {"column": _rows, "row": _cols, "replicated": _whole}

# a layer's token mixer -> its megatron (name, shard maker) pairs / its HF tensors by role
MIXER_TO_MEGATRON = {
    "full_attention": _full_attention_to_megatron,
    "linear_attention": _linear_attention_to_megatron,
}
MIXER_FROM_MEGATRON = {
    "full_attention": _full_attention_from_megatron,
    "linear_attention": _linear_attention_from_megatron,
}
