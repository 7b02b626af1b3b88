"""megatron-core ``TransformerLayer`` with SGLang's layer communicator.

With ``use_sglang_residual_pair`` the layer carries ``(output, residual)`` separately, as SGLang's
Qwen3 decoder layer does: the residual add happens inside the *next* norm
(``residual_add`` then ``rms_norm``), and what leaves the layer (and crosses a pipeline-stage
boundary) is ``cat([output, residual], -1)``: no cast, no fused add. Without it, the layer adds
the residual itself with megatron-core's bias-dropout-add and emits one hidden state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from megatron.core.transformer.transformer_layer import TransformerLayer
from megatron.core.utils import make_viewless_tensor

from .layers import join_carrier, residual_add, split_carrier
from .policy import dtype_of


def _kernel_add(layer: SGLangTransformerLayer, output: torch.Tensor, residual: torch.Tensor):
    return residual_add(output, residual, layer.kernel_policy)


def _megatron_add(layer: SGLangTransformerLayer, output: torch.Tensor, residual: torch.Tensor):
    """megatron-core's bias-dropout-add (``residual + dropout(output)``)."""
    with layer.bias_dropout_add_exec_handler():
        return layer.mlp_bda(layer.training, layer.config.bias_dropout_fusion)(
            (output, None), residual, layer.hidden_dropout
        )


def _emit_pair(layer: SGLangTransformerLayer, output: torch.Tensor, residual: torch.Tensor):
    return join_carrier(output, residual)


# use_sglang_residual_pair -> (add after attention, what the layer emits after the MLP)
RESIDUAL_BY_USE_SGLANG_RESIDUAL_PAIR: dict[bool, tuple[Callable[..., torch.Tensor], ...]] = {
    True: (_kernel_add, _emit_pair),
    False: (_megatron_add, _megatron_add),
}


class SGLangTransformerLayer(TransformerLayer):
    """Pre-norm decoder layer: ``norm -> attention -> (add+)norm -> MLP`` with SGLang numerics.

    Submodules are megatron's (built by ``TransformerLayer.__init__`` from the spec); only the
    wiring between them is SGLang's. Returns ``(carrier, None)`` like megatron's layer.
    """

    def __init__(self, config: Any, submodules: Any, **kwargs: Any) -> None:
        super().__init__(config, submodules, **kwargs)
        self.runtime_policy = config.true_on_policy.rp
        self.kernel_policy = config.true_on_policy.kernel
        self._add, self._emit = RESIDUAL_BY_USE_SGLANG_RESIDUAL_PAIR[
            bool(self.runtime_policy.use_sglang_residual_pair)
        ]
        self.dump: Callable[[str, torch.Tensor], None] | None = None

    def _add_norm(self, norm, carrier: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """SGLang ``RMSNorm(hidden, residual)``: returns ``(normed, new_residual)``."""
        hidden, residual = split_carrier(carrier, self.config.hidden_size)
        if residual is not None:
            hidden = residual_add(hidden, residual, self.kernel_policy)
        else:  # the embedding enters the residual stream in the residual dtype
            hidden = hidden.to(dtype_of(self.kernel_policy.residual_dtype))
        return norm(hidden), hidden

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, **kwargs: Any):
        kwargs.pop("dynamic_inference_decode_only", None)
        normed, residual = self._add_norm(self.input_layernorm, hidden_states)
        attn_out, _ = self.self_attention(
            normed,
            attention_mask=attention_mask,
            packed_seq_params=kwargs.get("packed_seq_params"),
        )
        hidden = self._add(self, attn_out, residual)
        normed = self.pre_mlp_layernorm(hidden)
        mlp_out, _ = self.mlp(normed)
        carrier = self._emit(self, mlp_out, hidden)
        if self.dump is not None:
            self.dump(f"layer.{self.layer_number - 1}", carrier)
        out = make_viewless_tensor(
            inp=carrier, requires_grad=carrier.requires_grad, keep_graph=True
        )
        return out, None
