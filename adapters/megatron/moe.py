"""The Qwen3-MoE block on megatron-core's own ``MoELayer`` module tree, with SGLang numerics.

megatron-core builds the tree: ``MoELayer`` (``mlp``) holding ``router`` (a ``TopKRouter``,
parameter ``router.weight``), ``token_dispatcher`` and ``experts`` (a ``SequentialMLP`` of
megatron ``MLP``s, ``experts.local_experts.{e}.linear_fc1/linear_fc2``, whose linears are the
spec's: ours). State-dict names are megatron's. The subclasses below replace only the steps
whose numerics megatron would choose differently from the rollout, and each calls the kernel the
rollout's ``_moe_mlp`` calls (``contractgen.adapters.kernels.moe``):

* ``SGLangTopKRouter``: logits by ``kernels.moe.router_logits`` (the gradient is the plain
  product's, through ``autograd.straight_through``: see ``gating``), then
  ``kernels.moe.select_experts`` (softmax with a fixed-order sum, stable-sort top-k with the
  policy's tie-break, the policy's top-k normalisation) instead of ``torch.softmax``/``torch.topk``.
* ``SGLangTokenDispatcher``: groups tokens per expert with ``kernels.moe.group_tokens`` (the
  policy's token order) instead of megatron's ``permute``, and combines a token's expert outputs
  with ``kernels.moe.combine`` (the policy's dtype and slot order) instead of megatron's
  probability-weighted ``unpermute`` (scatter-add). At EP 1 no communication: without sequence
  parallel every TP rank holds every token (megatron's all-gather / reduce-scatter would
  duplicate them).
* ``SGLangSequentialMLP``: each expert is the dense MLP's computation (``sglang_mlp_forward``:
  invariant matmul gate/up, the SiLU-GLU kernel, the row-parallel linear with the fixed-tree TP
  all-reduce), unweighted: megatron's expert ``MLP`` would multiply by the routing probability
  before ``linear_fc2``; here the weights enter once, in the combine, as in the rollout.
* ``SGLangMoELayer``: megatron's stage methods in megatron's order (``route``, ``preprocess``,
  ``dispatch``, ``routed_experts_compute``, ``combine``, ``postprocess``), minus the
  training-time refusal of TP>1 without sequence parallel (the contract disables it) and the
  CUDA-graph / recompute branches; a family's shared expert (``SGLangSharedExpertMLP``) runs on
  the layer's input and its output enters the dispatcher's combine (``kernels.moe.combine``'s
  ``shared_TH``, placed as ``kp.shared_expert_combine`` says) instead of megatron's add.

Between router and dispatcher the routing travels in top-k form, ``(weights_TK, ids_TK)`` best
first, not as megatron's ``[tokens, experts]`` map: the combine order ``topk_rank`` needs the
rank order the map loses. ``SGLangTopKRouter.route_topk`` gives it; its ``forward`` still
returns megatron's ``(probs, routing_map)`` for any other caller.

Expert parallelism (megatron's ``expert_model_parallel_size``, expert TP 1): each rank builds
its ``E / EP`` local experts whole, the dispatcher exchanges tokens and outputs with the EP peers
through the kernels' ``ep_gather_tokens`` / ``ep_combine`` (forward only, see the dispatcher).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.moe.moe_utils import get_default_pg_collection
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.shared_experts import SharedExpertMLP
from megatron.core.transformer.moe.token_dispatcher import MoEAllGatherTokenDispatcher

from ..kernels.linear import column_parallel_linear
from ..kernels.linear_attention import sigmoid_gate
from ..kernels.moe import (
    combine,
    ep_combine,
    ep_gather_tokens,
    group_tokens,
    router_logits,
    select_experts,
)
from .autograd import straight_through
from .layers import SWIGLU_BY_DISABLE_BIAS_SWIGLU_FUSION, sglang_mlp_forward
from .policy import dtype_of


class SGLangTopKRouter(TopKRouter):
    """megatron's ``TopKRouter`` (its ``weight`` parameter, ``[experts, hidden]``, replicated over
    TP) routing with the rollout's kernels. ``config.moe_router_topk`` is k; the checkpoint's
    ``norm_topk_prob`` (top-k weights renormalised, as ``kp.moe_topk_normalisation`` says) is
    ``config.true_on_policy_moe_norm_topk_prob``, else ``moe_router_pre_softmax=False``."""

    def __init__(self, config: Any, pg_collection: Any = None) -> None:
        super().__init__(config=config, pg_collection=pg_collection or get_default_pg_collection())
        self.kernel_policy = config.true_on_policy.kernel
        norm = getattr(config, "true_on_policy_moe_norm_topk_prob", None)
        self.normalize = not config.moe_router_pre_softmax if norm is None else norm

    def gating(self, input: torch.Tensor) -> torch.Tensor:
        """``[tokens, experts]`` logits: the kernel's value (megatron's ``gating`` would move the
        weight to CUDA and multiply with ``torch.mm`` or TE). The gradient is that of the same
        product in the router dtype, ``input @ weight.T`` through torch autograd: megatron's
        ``router_gating_linear`` cannot run here (0.16.1 calls ``te_general_gemm`` for any router
        dtype but float64, a name only defined when Transformer Engine imports)."""
        kp = self.kernel_policy
        rd = dtype_of(kp.moe_router_logits_dtype)
        return straight_through(
            lambda: router_logits(input, self.weight, kp),
            lambda: F.linear(input.to(rd), self.weight.to(rd)),
            [input, self.weight],
        )

    def route_topk(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights_TK, ids_TK)`` for ``[..., hidden]`` input flattened to tokens."""
        x = hidden_states.reshape(-1, self.config.hidden_size)
        return select_experts(
            self.gating(x), self.kernel_policy, top_k=self.topk, normalize=self.normalize
        )

    def routing(self, logits: torch.Tensor):
        """megatron's ``(probs, routing_map)``, ``[tokens, experts]``, from given logits."""
        weights, ids = select_experts(
            logits, self.kernel_policy, top_k=self.topk, normalize=self.normalize
        )
        return _dense_routing(weights, ids, logits.shape[-1])

    def forward(self, input: torch.Tensor, padding_mask: torch.Tensor | None = None):
        return _dense_routing(*self.route_topk(input), self.config.num_moe_experts)


def _dense_routing(weights_TK: torch.Tensor, ids_TK: torch.Tensor, num_experts: int):
    """Top-k form -> megatron's ``[tokens, experts]`` probabilities (zero where not routed) and
    boolean routing map."""
    probs = weights_TK.new_zeros((weights_TK.shape[0], num_experts)).scatter(1, ids_TK, weights_TK)
    routing_map = torch.zeros_like(probs, dtype=torch.bool).scatter(1, ids_TK, True)
    return probs, routing_map


class SGLangTokenDispatcher(MoEAllGatherTokenDispatcher):
    """Grouping and combine by the contract's MoE kernels (see the module docstring).
    ``dispatch_preprocess`` takes the router's top-k form.

    EP 1: no token communication (every TP rank holds every token). EP > 1 (whole experts per
    rank): ``token_dispatch`` gathers every EP peer's tokens and routes
    (``kernels.moe.ep_gather_tokens``: bits, rank order), the local experts run on the rows
    routed to them, and ``token_combine`` hands each token's outputs back to its rank
    (``kernels.moe.ep_combine``: as ``kp.moe_ep_combine`` says). Forward only: the exchange has
    no backward yet, so EP > 1 refuses to run with gradients enabled."""

    shared_TH: torch.Tensor | None = None
    """A shared expert's gated output for this forward's tokens (``SGLangMoELayer.forward``
    sets it), which the combine places as ``kp.shared_expert_combine`` says."""

    def __init__(self, *args: Any, config: Any, **kwargs: Any) -> None:
        super().__init__(*args, config=config, **kwargs)
        self.kernel_policy = config.true_on_policy.kernel

    def dispatch_preprocess(self, hidden_states, routing_map, probs):
        """``routing_map`` is ``ids_TK``, ``probs`` is ``weights_TK`` (top-k form)."""
        self.hidden_shape = hidden_states.shape
        self.ids_TK, self.weights_TK = routing_map, probs
        return hidden_states.reshape(-1, self.hidden_shape[-1]), probs

    def token_dispatch(self, hidden_states, probs):
        """EP 1: no data moves; the experts' input is marked as replicated over TP so its
        gradient, partial per rank, is all-reduced (megatron's
        ``copy_to_tensor_model_parallel_region``). EP > 1: every EP peer's tokens and routes."""
        if self.ep_size > 1:
            if torch.is_grad_enabled():
                raise NotImplementedError(
                    f"expert parallelism (EP {self.ep_size}) runs the forward only: the token "
                    "exchange has no backward yet; train and take gradients at EP 1"
                )
            hidden_states, self.ids_all, self.counts = ep_gather_tokens(
                hidden_states, self.ids_TK, self.ep_group
            )
            return hidden_states, probs
        self.ids_all, self.counts = self.ids_TK, [self.ids_TK.shape[0]]
        if self.tp_size > 1:
            hidden_states = copy_to_tensor_model_parallel_region(hidden_states, group=self.tp_group)
        return hidden_states, probs

    def dispatch_postprocess(self, hidden_states, probs):
        """The rows routed to this rank's experts (``kernels.moe.group_tokens``: the policy's
        token order), concatenated expert by expert, as megatron's ``permute`` lays them out.
        The experts run unweighted (the weights enter in the combine), so no probabilities."""
        groups = group_tokens(self.ids_all, self.config.num_moe_experts, self.kernel_policy)
        local = [groups[e] for e in self.local_expert_indices]
        self.tok = torch.cat([tok for tok, _ in local])
        self.slot = torch.cat([slot for _, slot in local])
        tokens_per_expert = torch.tensor([tok.numel() for tok, _ in local], dtype=torch.long)
        return hidden_states[self.tok], tokens_per_expert, None

    def combine_preprocess(self, hidden_states):
        """Expert outputs back to ``[tokens, k, hidden]`` over the dispatched tokens (each
        (token, slot) of a local expert written once, zeros elsewhere)."""
        T, K = self.ids_all.shape
        y_TKH = hidden_states.new_zeros((T, K, hidden_states.shape[-1]))
        return y_TKH.index_put((self.tok, self.slot), hidden_states)

    def token_combine(self, hidden_states):
        """The weighted sum in the policy's dtype and order: ``kernels.moe.combine`` (EP 1) or
        ``kernels.moe.ep_combine`` (EP > 1, which first returns each output to its token)."""
        kp = self.kernel_policy
        if self.ep_size == 1:
            return combine(hidden_states, self.weights_TK, self.ids_TK, kp, self.shared_TH)
        if self.shared_TH is not None:
            raise NotImplementedError(
                f"a shared expert under expert parallelism (EP {self.ep_size}) is not built "
                "(the EP combine has no shared term); use EP 1"
            )
        return ep_combine(
            hidden_states,
            self.weights_TK,
            self.ids_TK,
            kp,
            group=self.ep_group,
            rank=self.ep_group.rank(),
            counts=self.counts,
            experts_per_rank=self.num_local_experts,
        )

    def combine_postprocess(self, hidden_states):
        return hidden_states.view(self.hidden_shape)


class SGLangSequentialMLP(SequentialMLP):
    """megatron's ``SequentialMLP`` (its ``local_experts`` ``MLP``s, built by megatron-core with
    the spec's linears); each expert runs ``sglang_mlp_forward`` on its tokens, unweighted."""

    def __init__(self, num_local_experts: int, config: Any, submodules: Any, **kwargs: Any):
        kwargs.setdefault("pg_collection", get_default_pg_collection())
        super().__init__(num_local_experts, config, submodules, **kwargs)
        self.kernel_policy = config.true_on_policy.kernel
        self._swiglu = SWIGLU_BY_DISABLE_BIAS_SWIGLU_FUSION[
            bool(config.true_on_policy.rp.disable_bias_swiglu_fusion)
        ]

    def forward(self, permuted_local_hidden_states, tokens_per_expert, permuted_probs):
        """Each expert on its run of rows; the probabilities are left to the combine."""
        chunks = torch.split(permuted_local_hidden_states, tokens_per_expert.tolist())
        outputs = [
            sglang_mlp_forward(expert, tokens, self._swiglu, self.kernel_policy)[0]
            for expert, tokens in zip(self.local_experts, chunks, strict=True)
            if tokens.shape[0] > 0
        ]
        if not outputs:  # under EP a rank's experts may get no token at all
            return permuted_local_hidden_states.new_empty((0, self.config.hidden_size)), None
        return torch.cat(outputs), None


class SGLangSharedExpertMLP(SharedExpertMLP):
    """megatron's ``SharedExpertMLP`` (``linear_fc1``/``linear_fc2`` sharded as the dense MLP,
    ``gate_weight`` ``[1, hidden]`` replicated) as the rollout's ``_shared_expert``: the dense
    MLP's computation, then ``y * sigmoid(x · gate_weight)`` (``kernels.linear_attention.
    sigmoid_gate``, ``gate_dtype``) with the gate's logit from the invariant matmul (its
    gradient the plain product's, as the router's)."""

    def __init__(self, config: Any, submodules: Any, gate: bool, pg_collection: Any = None):
        pg_collection = pg_collection or get_default_pg_collection()
        super().__init__(config, submodules, gate, pg_collection)
        self.kernel_policy = config.true_on_policy.kernel
        self._swiglu = SWIGLU_BY_DISABLE_BIAS_SWIGLU_FUSION[
            bool(config.true_on_policy.rp.disable_bias_swiglu_fusion)
        ]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        kp = self.kernel_policy
        x = hidden_states.to(dtype_of(kp.dense_math_dtype))
        y, _ = sglang_mlp_forward(self, x, self._swiglu, kp)
        if self.gate_weight is None:
            return y
        logit = straight_through(
            lambda: column_parallel_linear(x, self.gate_weight, kp),
            lambda: F.linear(x, self.gate_weight),
            [x, self.gate_weight],
        )
        return sigmoid_gate(y, logit, kp)


class SGLangMoELayer(MoELayer):
    """megatron's ``MoELayer`` with ``SGLangTokenDispatcher`` (router and experts come from the
    spec: ``SGLangTopKRouter``, ``SGLangSequentialMLP``)."""

    def __init__(self, config: Any, submodules: Any = None, layer_number=None, pg_collection=None):
        pg_collection = pg_collection or get_default_pg_collection()
        super().__init__(config, submodules, layer_number, pg_collection)
        self.kernel_policy = config.true_on_policy.kernel
        self.token_dispatcher = SGLangTokenDispatcher(
            self.num_local_experts,
            self.local_expert_indices,
            config=self.config,
            pg_collection=pg_collection,
        )

    def route(self, hidden_states: torch.Tensor, padding_mask: torch.Tensor | None = None):
        """The router's top-k form ``(weights_TK, ids_TK)`` (see the module docstring)."""
        return self.router.route_topk(hidden_states)

    def forward(self, hidden_states: torch.Tensor, intermediate_tensors=None, padding_mask=None):
        # The norm output is rounded to the dense math dtype, as SGLang does before the MoE block.
        hidden_states = hidden_states.to(dtype_of(self.kernel_policy.dense_math_dtype))
        probs, routing = self.route(hidden_states, padding_mask)
        if self.shared_experts is not None:  # the family's shared expert, combined by policy
            shared = self.shared_experts(hidden_states)
            self.token_dispatcher.shared_TH = shared.reshape(-1, shared.shape[-1])
        hidden, probs = self.preprocess(hidden_states, probs, routing)
        dispatched, probs = self.dispatch(hidden, probs)
        output, mlp_bias = self.routed_experts_compute(dispatched, probs)
        return self.postprocess(self.combine(output), None), mlp_bias
