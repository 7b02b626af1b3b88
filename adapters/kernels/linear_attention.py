"""Gated DeltaNet, the linear-attention block of hybrid families (Qwen3-Next): the causal
depthwise conv, the gated delta rule (chunked for prefill, re-score and the trainer; recurrent
for a decode step), the gates, with every cast the kernel policy names.

The delta rule over one sequence, per value head (``S`` the ``[Dk, Dv]`` state, ``g_t <= 0`` the
log-decay, ``beta_t`` in (0, 1), ``k_t``/``q_t`` l2-normalised, ``q_t`` scaled by ``Dk**-0.5``)::

    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T,   o_t = S_t^T q_t

Chunked form (``kp.delta_rule_chunk`` = C tokens per chunk, chunks start at absolute position 0
of the sequence, and every chunk is zero-padded to C so the products have one shape wherever a
chunk falls): with ``G`` the in-chunk cumulative log-decay, ``D_ij = exp(G_i - G_j)`` (i >= j),
``M = I + strictly_lower((beta k) k^T ⊙ D)``, ``U = M^-1 (beta v)``, ``W = M^-1 (beta k ⊙ exp G)``::

    V' = U - W S;   O = (q ⊙ exp G) S + (q k^T ⊙ D) V';   S <- exp(G_C) S + (k ⊙ exp(G_C - G))^T V'

``kp.delta_rule_solve`` says how ``M^-1`` is applied (``SOLVES``); the chunk products run in
``kp.delta_rule_chunk_dtype``, the carried ``S`` in ``kp.delta_rule_state_dtype``. The PyTorch
reference is the only implementation (no Triton kernel, not in ``registry.BACKENDS``): on CUDA
these device-generic torch ops run beside the Triton backend's other ops, on both sides alike.

Every pointwise op here gives each row bits that depend on that row alone (``sigmoid``,
``silu``, ``softplus`` below, not torch's CPU kernels), so a sequence scored alone and in a
packed batch agree bit for bit; only the conv and the delta rule see more than one token, and
they run per sequence.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ._dtypes import dtype_of
from .policy import KernelPolicy
from .reduce import fixed_sum

L2_EPS = 1e-6  # inside the l2norm's rsqrt (the FLA kernels' and HF's value)


def causal_conv(
    x_LC: torch.Tensor, w_CK: torch.Tensor, state_C_K1: torch.Tensor | None, kp: KernelPolicy
) -> tuple[torch.Tensor, torch.Tensor]:
    """SiLU of the causal depthwise conv of one sequence's channels ``x_LC`` (taps ``w_CK``,
    the last tap on the current token), in ``kp.conv_dtype``: the taps summed oldest first (a
    left fold), SiLU there, rounded to ``x``'s dtype. ``state_C_K1``: the ``K - 1`` inputs
    before ``x`` (zeros at a sequence start). Returns ``(out_LC, new state)``."""
    cd = dtype_of(kp.conv_dtype)
    L, K = x_LC.shape[0], w_CK.shape[1]
    if state_C_K1 is None:
        state_C_K1 = x_LC.new_zeros(x_LC.shape[1], K - 1)
    full_CT = torch.cat([state_C_K1.to(x_LC.dtype), x_LC.t()], dim=1)  # [C, K - 1 + L]
    full, w = full_CT.to(cd), w_CK.to(cd)
    acc = full[:, 0:L] * w[:, 0:1]
    for j in range(1, K):
        acc = acc + full[:, j : j + L] * w[:, j : j + 1]
    out = silu(acc).t().to(x_LC.dtype)
    return out, full_CT[:, full_CT.shape[1] - (K - 1) :].contiguous()


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """``x * rsqrt(sum(x²) + eps)`` over the last dim (fixed-order sum), in ``x``'s dtype."""
    return x * torch.rsqrt(fixed_sum(x * x, -1)[..., None] + L2_EPS)


def _row_substitution(m_HCC: torch.Tensor, b_HCD: torch.Tensor) -> torch.Tensor:
    """``M^-1 b`` for unit-lower-triangular ``M`` given by its strictly-lower part ``m``: rows in
    ascending order, ``x_i = b_i - sum_{j<i} m_ij x_j``, each sum a fixed-order halving tree over
    the ``i`` earlier rows (its order depends on ``i`` alone). No in-place writes: the trainer
    differentiates through it."""
    rows = [b_HCD[..., 0, :]]
    for i in range(1, b_HCD.shape[-2]):
        earlier = torch.stack(rows, dim=-2)  # [..., i, D]
        rows.append(b_HCD[..., i, :] - fixed_sum(m_HCC[..., i, :i, None] * earlier, -2))
    return torch.stack(rows, dim=-2)


def _lapack(m_HCC: torch.Tensor, b_HCD: torch.Tensor) -> torch.Tensor:
    eye = torch.eye(m_HCC.shape[-1], dtype=m_HCC.dtype, device=m_HCC.device)
    return torch.linalg.solve_triangular(m_HCC + eye, b_HCD, upper=False, unitriangular=True)


SOLVES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "row_substitution": _row_substitution,
    "lapack": _lapack,
}


def _solve(kp: KernelPolicy) -> Callable:
    try:
        return SOLVES[kp.delta_rule_solve]
    except KeyError:
        raise ValueError(
            f"kernel_policy.delta_rule_solve={kp.delta_rule_solve!r}; known: {sorted(SOLVES)}"
        ) from None


def _prepare(q_LHD, k_LHD, v_LHD, g_LH, beta_LH, kp: KernelPolicy):
    """Heads first, in the chunk dtype; q/k l2-normalised, q scaled; key heads repeated to the
    value heads (each key head serves consecutive value heads)."""
    cd = dtype_of(kp.delta_rule_chunk_dtype)
    rep = v_LHD.shape[1] // k_LHD.shape[1]
    q, k = (l2norm(t.to(cd)).repeat_interleave(rep, dim=1) for t in (q_LHD, k_LHD))
    q = q * (q.shape[-1] ** -0.5)
    return [t.transpose(0, 1) for t in (q, k, v_LHD.to(cd), g_LH.to(cd), beta_LH.to(cd))]


def chunked_delta_rule(
    q_LHD: torch.Tensor,
    k_LHD: torch.Tensor,
    v_LHD: torch.Tensor,
    g_LH: torch.Tensor,
    beta_LH: torch.Tensor,
    state_HKV: torch.Tensor | None,
    kp: KernelPolicy,
    *,
    start: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over one sequence's tokens at absolute positions ``start ..``
    (``q``/``k`` ``[L, Hk, Dk]``, ``v`` ``[L, Hv, Dv]``, ``g``/``beta`` ``[L, Hv]``), from
    ``state`` (zeros when None), chunked as the module docstring says; the first chunk ends at
    the next multiple of C after ``start``. Returns ``(o [L, Hv, Dv] in v's dtype, final state
    in kp.delta_rule_state_dtype)``."""
    C, sd = kp.delta_rule_chunk, dtype_of(kp.delta_rule_state_dtype)
    q, k, v, g, beta = _prepare(q_LHD, k_LHD, v_LHD, g_LH, beta_LH, kp)
    cd, (H, L, Dk), Dv = q.dtype, k.shape, v.shape[-1]
    S = torch.zeros(H, Dk, Dv, dtype=sd) if state_HKV is None else state_HKV.to(sd)
    S = S.to(q.device)
    solve = _solve(kp)
    lower = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    strict = lower.tril(-1)
    out = []
    lo = 0
    while lo < L:
        hi = min(L, lo + C - (start + lo) % C)  # chunk boundaries at absolute multiples of C
        n, pad = hi - lo, C - (hi - lo)

        def chunk(t, lo=lo, hi=hi, pad=pad):
            t = t[:, lo:hi]
            return F.pad(t, (0, 0, 0, pad)) if t.dim() == 3 else F.pad(t, (0, pad))

        qc, kc, vc, gc, bc = (chunk(t) for t in (q, k, v, g, beta))
        G = torch.cumsum(gc, dim=-1)  # [H, C]: a sequential scan
        D = torch.exp((G[:, :, None] - G[:, None, :]).masked_fill(~lower, float("-inf")))
        kb = kc * bc[..., None]
        m = ((kb @ kc.transpose(-1, -2)) * D).masked_fill(~strict, 0.0)
        U = solve(m, vc * bc[..., None])
        W = solve(m, kb * torch.exp(G)[..., None])
        Sc = S.to(cd)
        v_new = U - W @ Sc
        o = (qc * torch.exp(G)[..., None]) @ Sc + ((qc @ kc.transpose(-1, -2)) * D) @ v_new
        out.append(o[:, :n])
        g_last = G[:, -1:]
        S = (
            Sc * torch.exp(g_last)[..., None]
            + (kc * torch.exp(g_last - G)[..., None]).transpose(-1, -2) @ v_new
        ).to(sd)
        lo = hi
    o_HLD = torch.cat(out, dim=1) if out else v.new_zeros(H, 0, Dv)
    return o_HLD.transpose(0, 1).to(v_LHD.dtype), S


def continue_delta_rule(
    new: tuple[torch.Tensor, ...],
    boundary_state: torch.Tensor | None,
    pending: tuple[torch.Tensor, ...] | None,
    start: int,
    kp: KernelPolicy,
) -> tuple[torch.Tensor, torch.Tensor | None, tuple[torch.Tensor, ...]]:
    """The chunked delta rule continued over one sequence's ``new`` tokens ``(q, k, v, g,
    beta)`` at absolute positions ``start ..``, so that every token's output has the bits a
    re-score of the whole sequence gives it, whether the tokens come as one prefill, as a prefill
    split anywhere, or one decode token at a time.

    A chunk's rows depend on the chunk's earlier rows alone (``G`` is a running sum, ``D`` and
    the solves are lower triangular, later rows enter the products only times an exact 0), and
    every chunk is zero padded to ``C`` rows, so an unfinished chunk computed from its start
    gives its rows the bits of the finished one. Hence the carried state is the state at the
    last chunk boundary (``boundary_state``, None for zeros) plus the inputs of the tokens since
    it (``pending``, None for none): the tokens since the boundary are run again with the new
    ones, from the boundary. Returns ``(o [n, Hv, Dv] of the new tokens, the state at the new
    last boundary, the inputs since it)``; a decode step costs one chunk of at most ``C``
    tokens, not one recurrent step."""
    C = kp.delta_rule_chunk
    n = new[0].shape[0]
    held = 0 if pending is None else pending[0].shape[0]
    if held != start % C:
        raise ValueError(
            f"{held} tokens held since the last chunk boundary, but the new tokens start at "
            f"position {start} (a boundary every {C}): the request's state and position disagree"
        )
    run = new if pending is None else tuple(torch.cat(p) for p in zip(pending, new, strict=True))
    first, end = start - held, start + n
    full = end // C * C - first  # tokens of whole chunks: they move the boundary
    state = boundary_state
    outs = []
    if full:
        o, state = chunked_delta_rule(*(t[:full] for t in run), state, kp, start=first)
        outs.append(o)
    rest = tuple(t[full:] for t in run)
    if rest[0].shape[0]:
        o, _ = chunked_delta_rule(*rest, state, kp, start=first + full)
        outs.append(o)
    o = torch.cat(outs) if len(outs) > 1 else outs[0]
    return o[held:], state, rest


def recurrent_delta_rule(
    q_LHD: torch.Tensor,
    k_LHD: torch.Tensor,
    v_LHD: torch.Tensor,
    g_LH: torch.Tensor,
    beta_LH: torch.Tensor,
    state_HKV: torch.Tensor | None,
    kp: KernelPolicy,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The delta rule one token at a time (decode): the recurrence in the module docstring in
    the chunk dtype, the state rounded to the state dtype after every token. Other roundings
    than the chunked form: under a prefill re-score contract only the re-score is compared."""
    sd = dtype_of(kp.delta_rule_state_dtype)
    q, k, v, g, beta = _prepare(q_LHD, k_LHD, v_LHD, g_LH, beta_LH, kp)
    H, L, Dk = k.shape
    S = torch.zeros(H, Dk, v.shape[-1], dtype=sd) if state_HKV is None else state_HKV.to(sd)
    S = S.to(q.device)
    out = []
    for t in range(L):
        Sc = S.to(q.dtype) * torch.exp(g[:, t])[:, None, None]
        kv = fixed_sum(Sc * k[:, t, :, None], -2)  # [H, Dv]
        delta = (v[:, t] - kv) * beta[:, t, None]
        Sc = Sc + k[:, t, :, None] * delta[:, None, :]
        out.append(fixed_sum(Sc * q[:, t, :, None], -2))
        S = Sc.to(sd)
    o_HLD = torch.stack(out, dim=1) if out else v.new_zeros(H, 0, v.shape[-1])
    return o_HLD.transpose(0, 1).to(v_LHD.dtype), S


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """``1 / (1 + exp(-x))`` for ``x >= 0``, ``e / (1 + e)`` with ``e = exp(x)`` below, in ``x``'s
    dtype: every element by ``exp`` and correctly rounded adds and divides, so its bits depend
    on its value alone. ``torch.sigmoid`` (and ``F.silu``, ``F.softplus``) on CPU compute the
    vector body and the scalar tail of a tensor with different ``exp`` code that differ in the
    last bit, so a token's gate would depend on where its row falls in the batch (one sequence
    alone vs packed; ``tests/kernels/test_linear_attention_kernels.py``). ``exp`` is one
    vectorised function for every element, tail included. The ``exp`` argument is ``-|x|`` (no
    overflow, no NaN in the gradient of the branch ``where`` drops), written as a ``where`` so
    the gradient at 0 is right."""
    pos = x >= 0
    e = torch.exp(torch.where(pos, -x, x))
    return torch.where(pos, 1.0 / (1.0 + e), e / (1.0 + e))


def silu(x: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(x)`` (``sigmoid`` above: bits by value, not by place in the tensor)."""
    return x * sigmoid(x)


SOFTPLUS_THRESHOLD = 20.0  # F.softplus's: above it softplus(x) is x (HF's call leaves it so)


def softplus(x: torch.Tensor) -> torch.Tensor:
    """``log1p(exp(x))``, ``x`` itself above ``SOFTPLUS_THRESHOLD`` (``F.softplus``'s formula,
    from ``exp`` and ``log1p``, each one function for every element; see ``sigmoid``). The
    ``exp`` argument is clamped at the threshold: no overflow in the branch ``where`` drops."""
    t = SOFTPLUS_THRESHOLD
    return torch.where(x > t, x, torch.log1p(torch.exp(x.clamp(max=t))))


def decay_and_beta(
    a_LH: torch.Tensor,
    b_LH: torch.Tensor,
    A_log_H: torch.Tensor,
    dt_bias_H: torch.Tensor,
    kp: KernelPolicy,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``, in
    ``kp.gate_dtype`` (each token's row depends on that row alone)."""
    gd = dtype_of(kp.gate_dtype)
    g = -torch.exp(A_log_H.to(gd)) * softplus(a_LH.to(gd) + dt_bias_H.to(gd))
    return g, sigmoid(b_LH.to(gd))


def sigmoid_gate(x: torch.Tensor, gate: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    """``x * sigmoid(gate)`` in ``kp.gate_dtype``, rounded to ``x``'s dtype (the attention output
    gate, the shared expert's gate)."""
    gd = dtype_of(kp.gate_dtype)
    return (x.to(gd) * sigmoid(gate.to(gd))).to(x.dtype)


def silu_gate(x: torch.Tensor, gate: torch.Tensor, kp: KernelPolicy) -> torch.Tensor:
    """``x * silu(gate)`` in ``kp.gate_dtype``, rounded to ``x``'s dtype (after the DeltaNet
    output's RMSNorm)."""
    gd = dtype_of(kp.gate_dtype)
    return (x.to(gd) * silu(gate.to(gd))).to(x.dtype)
