"""The report's ``kernel_calls``: evidence that the contract's kernels ran on the scored path.

Every scored (baseline) run of the one-shot gate records its contract-kernel calls
(``adapters.kernels.audit``): each rollout TP's run and each trainer layout's forward, every rank
of it summed. With ``--strict`` the runs also watch for stock ops the contract replaces; the gate
then fails when one ran outside every contract kernel, or when a kind of op the contract replaces
(matmul, attention, norm, log-softmax) had no contract-kernel call at all in a run.
"""

from __future__ import annotations

from typing import Any

SIDES = ("rollout", "trainer")

# kind of op the contract replaces -> the contract ops that implement it (one call at least)
REQUIRED: dict[str, tuple[str, ...]] = {
    "matmul": ("invariant_matmul",),
    "attention": ("chunked_attention", "chunked_attention_lse"),
    "norm": ("rms_norm",),
    "log-softmax": ("token_logprobs", "full_logprobs", "vocab_parallel_token_logprobs"),
}


def section(run: Any) -> dict:
    """``kernel_calls`` of a finished ``GateRun``: per side and run, each contract op's calls;
    under ``--strict`` the stock ops seen and the kinds of op with no contract call."""
    out: dict = {"strict": run.config.strict, "rollout": {}, "trainer": {}}
    stock: list[dict] = []
    missing: list[dict] = []
    for (side, name), calls in run.kernel_calls.items():  # in the order the runs ran
        if calls is None:
            missing.append({"side": side, "layout": name, "kind": None, "ops": []})
            continue
        out[side][name] = dict(calls.calls)
        stock += [{"side": side, "layout": name, **e} for e in calls.stock or ()]
        missing += [
            {"side": side, "layout": name, "kind": kind, "ops": list(ops)}
            for kind, ops in REQUIRED.items()
            if not any(calls.calls.get(op) for op in ops)
        ]
    out["stock_ops"] = stock if run.config.strict else None
    out["missing"] = missing if run.config.strict else None
    return out


def failures(report: dict) -> list[str]:
    """Why ``--strict`` fails the gate (empty without ``--strict`` or when it passes)."""
    kc = report.get("kernel_calls")
    if not kc or not kc["strict"]:
        return []
    out = [
        f"--strict: {e['side']} {e['layout']} rank {e['rank']}: stock {e['stock']} ran "
        f"{e['calls']} time(s) outside every contract kernel (the contract's op: {e['op']})"
        for e in kc["stock_ops"]
    ]
    for m in kc["missing"]:
        if m["kind"] is None:
            out.append(f"--strict: {m['side']} {m['layout']}: its scored run recorded no calls")
        else:
            out.append(
                f"--strict: {m['side']} {m['layout']}: no contract {m['kind']} kernel ran "
                f"({', '.join(m['ops'])}: 0 calls)"
            )
    return out


def table(report: dict) -> list[str]:
    """The text table's lines: calls per scored run, and what ``--strict`` saw."""
    kc = report.get("kernel_calls")
    if not kc:
        return []
    lines = ["kernels   contract-kernel calls per scored run, all ranks (per op: kernel_calls)"]
    lines += [
        f"          {side} "
        + ", ".join(f"{name} {sum(c.values())}" for name, c in kc[side].items())
        for side in SIDES
        if kc[side]
    ]
    if kc["strict"]:
        bad = len(kc["stock_ops"]) + len(kc["missing"])
        lines.append(
            "          --strict: no stock op on the scored path, every kind of op by its kernel"
            if not bad
            else f"          --strict: {bad} problem(s), listed below"
        )
    return lines
