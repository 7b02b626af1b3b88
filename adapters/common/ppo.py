"""The trainer role's RL loss, one copy for every trainer target: PPO-clip over the scored
response tokens with the statistics the gate reports (``TrainStepResult``). Torch only."""

from __future__ import annotations

import torch


def ppo_clip(
    new: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, clip_eps: float, total: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss, stats)`` of this rank's tokens: ``new`` (float32 logprobs, with grad), ``old``
    (the rollout's) and ``adv`` per token; every sum divided by the step's global response-token
    count ``total``, so ranks' shares add up (a plain sum). ``stats``: loss, KL (k3), the loss
    at a ratio of exactly 1, the advantage-weighted logprob, and max |ratio - 1|."""
    ratio = torch.exp(new - old)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    loss = -surrogate.sum() / total
    # the loss at a ratio of exactly 1: min(1 * A, clip(1) * A) is A bit for bit, so this
    # equals ``loss`` bitwise exactly when every ratio is 1 (``loss_if_ratio_one``)
    loss_if_ratio_one = -adv.sum() / total
    # the policy-gradient objective's value, for the parent to recompute from what it sent
    advantage_logprob = (adv * new.detach()).sum() / total
    d = (old - new).detach()
    stats = torch.stack(
        [
            loss.detach(),
            (torch.exp(d) - d - 1).sum() / total,
            loss_if_ratio_one,
            advantage_logprob,
            (ratio.detach() - 1).abs().max() if new.numel() else ratio.new_zeros(()),
        ]
    )
    return loss, stats
