"""A training step's summary over the trainer layouts, which run one after another: summed
times, response-token throughput, the worst deviation, the largest push, and where a rollout
run's time went."""

from __future__ import annotations

from typing import Any


def step_push(entries: list[dict]) -> dict:
    """A step's ``push``: the largest push of any layout (they push the same tensors) and its
    share of the full weights' bytes."""
    largest = max(entries, key=lambda e: e["push"]["bytes"])["push"]
    return {**largest, "fraction": round(largest["bytes"] / largest["full_bytes"], 6)}


def worst(values) -> float:
    return max((abs(v) for v in values), default=0.0)


def tokens_per_s(entries: list[dict]) -> float:
    """A step's response tokens over its wall time without the gradient check (``time_s.step``),
    both summed over the trainer layouts (which run one after another)."""
    seconds = sum(e["time_s"]["step"] for e in entries)
    return round(sum(e["response_tokens"] for e in entries) / seconds, 2) if seconds else 0.0


def rollout_parts(result: Any) -> dict[str, float]:
    """Where a rollout run's time went on its rank 0 (``RolloutResult``): taking the pushed
    weights in (``rollout_load``), checking them (``rollout_sync_check``), generating and
    re-scoring."""
    return {
        **{f"rollout_{k}": v for k, v in result.extra.get("time_s", {}).items()},
        "rollout_generate": result.generate_seconds,
        "rollout_rescore": result.rescore_seconds,
    }


def summed_times(entries: list[dict]) -> dict[str, float]:
    """A step's ``time_s``: each phase summed over the trainer layouts (run one after another)."""
    out: dict[str, float] = {}
    for e in entries:
        for phase, seconds in e["time_s"].items():
            if seconds is not None:
                out[phase] = round(out.get(phase, 0.0) + seconds, 4)
    return out
