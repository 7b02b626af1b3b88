"""Gated DeltaNet (a hybrid family's linear-attention mixer) on megatron-core, with the rollout's
numerics: the ``self_attention`` slot of a layer whose mixer (``Family.mixer``, megatron's
``linear_attention_freq``) is linear attention.

megatron-core 0.16.1's own ``GatedDeltaNet`` imports FLA and allocates on CUDA when built, refuses
packed sequences, and fuses its input projection as ``[q k v | z | b | a]`` per rank. This module
keeps its config fields (``linear_*``), its slot names (``in_proj``, ``conv1d``, ``dt_bias``,
``A_log``, ``out_norm``, ``out_proj``) and its shapes, with the two input projections the rollout
shards (HF's ``in_proj_qkvz`` and ``in_proj_ba``, rows grouped per key head, so a TP rank's rows
are whole key-head groups) and the rollout's kernels (``kernels.linear_attention``).

Per rank: ``in_proj_qkvz`` / ``in_proj_ba`` column-parallel; ``conv1d.weight``
``[conv_dim / TP, 1, taps]``, this rank's q heads, k heads and v heads (each part split on its
own, ``Weight.parts``); ``dt_bias`` / ``A_log`` of its value heads; ``out_norm`` (the gated
RMSNorm over one value head, never zero-centred) replicated, its gradient summed over TP
(``grads.TP_PARTIAL_GRAD_NAMES``: each rank sees its own heads); ``out_proj`` row-parallel
through the contract's row linear and fixed-tree all-reduce.

Forward over a pack: the projections and gates over every row (per-row ops); per packed path
(a sequence's rows, positions ``0 ..``) the causal conv and the chunked delta rule from a zero
state, chunks at the path's absolute positions: the rollout's prefill calls, same arguments and
casts, so the bits are the rollout's. A path's rows it does not own (a shared prompt of a
prefix-tree pack) are computed again and dropped. Differentiable: the kernels are pure torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import build_module

from ..kernels.linear_attention import causal_conv, chunked_delta_rule, decay_and_beta, silu_gate
from ..kernels.norm import rms_norm
from .layers import ATTENTION_INPUT_CAST, SGLangNorm
from .packing import SGLangPackedSeqParams


@dataclass
class SGLangGatedDeltaNetSubmodules:
    """The module classes of one Gated DeltaNet (megatron's ``GatedDeltaNetSubmodules`` with
    the input projection in HF's two parts)."""

    in_proj: type
    out_norm: type
    out_proj: type


class SGLangGatedOutputNorm(SGLangNorm):
    """The RMSNorm over each value head of the delta rule's output, then ``x * silu(z)``
    (``kernels.linear_attention.silu_gate``, ``gate_dtype``). A plain scale in every family."""

    zero_centred_allowed = False

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        kp = self.kernel_policy
        return silu_gate(rms_norm(x, self.scale(), self.eps, kp), z, kp)


class SGLangGatedDeltaNet(MegatronModule):
    """Gated DeltaNet of one layer (see the module docstring); ``forward`` takes and returns
    megatron's ``[tokens, 1, hidden]`` and ``(output, bias)``."""

    def __init__(
        self,
        config: Any,
        submodules: SGLangGatedDeltaNetSubmodules,
        layer_number: int,
        pg_collection: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(config=config)
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        self.layer_number = layer_number
        self.kernel_policy = config.true_on_policy.kernel
        self._input_cast = ATTENTION_INPUT_CAST[
            bool(config.true_on_policy.rp.cast_attention_input_to_dense_math_dtype)
        ]
        tp = pg_collection.tp.size()
        c = config
        self.hk, self.hv = c.linear_num_key_heads // tp, c.linear_num_value_heads // tp
        self.dk, self.dv = c.linear_key_head_dim, c.linear_value_head_dim
        key_dim, value_dim = c.linear_num_key_heads * self.dk, c.linear_num_value_heads * self.dv
        linear = {"config": c, "bias": False, "is_expert": False, "tp_group": pg_collection.tp}
        column = {**linear, "init_method": c.init_method, "gather_output": False}
        self.in_proj_qkvz = build_module(
            submodules.in_proj,
            c.hidden_size,
            2 * key_dim + 2 * value_dim,
            skip_bias_add=False,
            **column,
        )
        self.in_proj_ba = build_module(
            submodules.in_proj,
            c.hidden_size,
            2 * c.linear_num_value_heads,
            skip_bias_add=False,
            **column,
        )
        conv_local = (2 * key_dim + value_dim) // tp
        self.conv1d = torch.nn.Conv1d(
            conv_local,
            conv_local,
            c.linear_conv_kernel_dim,
            groups=conv_local,
            bias=False,
            dtype=c.params_dtype,
        )
        self.dt_bias = torch.nn.Parameter(torch.ones(self.hv, dtype=c.params_dtype))
        self.A_log = torch.nn.Parameter(torch.zeros(self.hv, dtype=c.params_dtype))
        for p in (self.conv1d.weight, self.dt_bias, self.A_log):
            set_tensor_model_parallel_attributes(p, is_parallel=True, dim=0, stride=1)
        self.out_norm = build_module(
            submodules.out_norm, config=c, hidden_size=self.dv, eps=c.layernorm_epsilon
        )
        self.out_proj = build_module(
            submodules.out_proj,
            value_dim,
            c.hidden_size,
            init_method=c.output_layer_init_method,
            input_is_parallel=True,
            skip_bias_add=True,
            **linear,
        )

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: Any = None,
        packed_seq_params: SGLangPackedSeqParams | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not isinstance(packed_seq_params, SGLangPackedSeqParams):
            raise TypeError(
                "SGLangGatedDeltaNet needs packed_seq_params=SGLangPackedSeqParams (its packed "
                "paths); build one with packing.thd_params(pack_sequences(...))"
            )
        kp = self.kernel_policy
        x = self._input_cast(hidden_states, kp)
        T, hk, hv, dk, dv = x.shape[0], self.hk, self.hv, self.dk, self.dv
        r = hv // hk
        qkvz, _ = self.in_proj_qkvz(x)  # per key head: q, k, then its r v heads and r z heads
        q, k, v, z = qkvz.view(T, hk, 2 * dk + 2 * r * dv).split([dk, dk, r * dv, r * dv], -1)
        ba, _ = self.in_proj_ba(x)  # per key head: its r beta inputs, then r decay inputs
        b, a = ba.view(T, hk, 2 * r).split([r, r], dim=-1)
        mixed_TC = torch.cat([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], dim=-1)
        g_TH, beta_TH = decay_and_beta(
            a.reshape(T, hv), b.reshape(T, hv), self.A_log, self.dt_bias, kp
        )
        o_THD = self._delta_rule(mixed_TC, g_TH, beta_TH, packed_seq_params)
        o = self.out_norm(o_THD, z.reshape(T, hv, dv)).reshape(T, 1, hv * dv)
        return self.out_proj(o)

    def _delta_rule(self, mixed_TC, g_TH, beta_TH, params: SGLangPackedSeqParams):
        """Conv and chunked delta rule per packed path, from zero states; ``[T, hv, dv]``."""
        kp, hk, hv, dk, dv = self.kernel_policy, self.hk, self.hv, self.dk, self.dv
        w_CK = self.conv1d.weight[:, 0, :]
        outs, rows = [], []
        for path, owned in zip(params.paths, params.owned, strict=True):
            if owned.numel() == 0:
                continue
            n = path.numel()
            conv, _ = causal_conv(mixed_TC[path], w_CK, None, kp)
            cq, ck, cv = conv.split([hk * dk, hk * dk, hv * dv], dim=-1)
            o, _ = chunked_delta_rule(
                cq.view(n, hk, dk),
                ck.view(n, hk, dk),
                cv.view(n, hv, dv),
                g_TH[path],
                beta_TH[path],
                None,
                kp,
                start=0,
            )
            outs.append(o[owned])
            rows.append(path[owned])
        T = mixed_TC.shape[0]
        if params.flat:  # every path its own rows in order: the pieces are the pack
            return torch.cat(outs)
        out = mixed_TC.new_zeros((T, hv, dv))
        return out.index_copy(0, torch.cat(rows), torch.cat(outs).to(out.dtype))
