"""Plan output: text for people, JSON for tools, shell (``export`` lines and the two commands)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping
from typing import Any

from .plan import LaunchPlan, Rendered

# Table -> heading in the text format.
HEADINGS: Mapping[str, str] = {
    "env": "environment",
    "sglang": "SGLang server arguments",
    "megatron": "Megatron arguments",
    "miles": "miles arguments",
}


def _layout_line(plan: LaunchPlan) -> str:
    lay = plan.layout
    cp = f" ({plan.cp_comm_type})" if plan.cp_comm_type else ""
    return (
        f"train tp={lay.tp} pp={lay.pp} cp={lay.cp}{cp} dp={lay.dp}"
        f"{f' ep={lay.ep}' if lay.ep > 1 else ''} (world {lay.train_world}); "
        f"rollout tp={lay.rollout_tp_size} dp={lay.rollout_dp} ({lay.rollout_gpus} GPU"
        f"{'s' if lay.rollout_gpus > 1 else ''})"
    )


def _vocab_line(plan: LaunchPlan) -> str:
    v, tp, chunk = plan.model.vocab_size, plan.layout.tp, plan.vocab_chunk
    per_rank = plan.padded_vocab // tp
    return (
        f"{v}, padded by Megatron to {plan.padded_vocab} (multiple of {chunk} x TP {tp}): "
        f"{per_rank} per rank = {per_rank // chunk} whole {chunk}-wide log-softmax chunks"
    )


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool | None) else str(value)


def _note(row: Rendered) -> str:
    extra = []
    if row.note:
        extra.append(row.note)
    if row.fork_only:
        extra.append("true-on-policy fork only")
    return f" [{'; '.join(extra)}]" if extra else ""


def to_text(plan: LaunchPlan) -> str:
    lines = [
        f"plan for {plan.contract_id} ({plan.fingerprint[:19]}…) on {plan.model.name}",
        f"  layout: {_layout_line(plan)}",
        f"  logprobs: {plan.logprob_contract}",
        f"  vocab: {_vocab_line(plan)}",
    ]
    if plan.newer_contract:
        lines.append(f"  note: superseded by {plan.newer_contract}")
    for table, heading in HEADINGS.items():
        lines += ["", f"{heading}:"]
        shown_at: dict[str, int] = {}  # an argument two policy fields ask for: one line, both
        for row in plan.rows:
            if row.table != table or row.kind not in ("arg", "env") or not row.emitted:
                continue
            shown = f"{row.args[0]}={row.args[1]}" if row.kind == "env" else shlex.join(row.args)
            if shown in shown_at:
                lines[shown_at[shown]] += f"; also {row.source}: {row.reason}{_note(row)}"
                continue
            shown_at[shown] = len(lines)
            lines.append(f"  {shown:<48} {row.source}: {row.reason}{_note(row)}")
    if plan.needs_newer_sglang:
        lines += ["", f"needs a newer SGLang than {plan.sglang_release}:"]
        lines += [f"  {flag}: from {where}" for flag, where in plan.needs_newer_sglang]
    lines += [
        "",
        "real SGLang leaves the proven numerics here (the gate runs this project's SGLang numerics):",
    ]
    lines += [f"  {op}: {why}" for op, why in plan.unproven_on_real_sglang]
    lines += ["", "applied inside the engines once the contract is named (no flag):"]
    for row in plan.engine_side:
        lines.append(f"  {row.source} = {_show(row.value)}: {row.reason}")
    lines += ["", "never pass:"]
    for row in plan.forbidden:
        lines.append(f"  {row.args[0]:<48} ({row.table}) {row.source}: {row.reason}")
    if plan.lora is not None:
        lora = plan.lora
        lines += [
            "",
            f"LoRA adapter {lora.path} (r={lora.rank}, alpha={lora.alpha:g}, "
            f"{lora.tensors} tensors, base {lora.base_model}): served unmerged, checked against "
            "the contract's lora section and the model's shapes:",
            f"  {shlex.join(lora.sglang_args)}",
        ]
    lines += [
        "",
        "miles (one command; it starts SGLang itself, whose arguments it takes as --sglang-*):",
    ]
    lines.append(f"  {shlex.join(plan.trainer_command)}")
    lines += ["", "add to it what no contract knows:"]
    lines += [f"  {args:<48} {what}" for args, what in plan.you_add]
    lines += ["", "SGLang alone (a server outside miles):", f"  {shlex.join(plan.rollout_command)}"]
    return "\n".join(lines) + "\n"


def to_json_data(plan: LaunchPlan) -> dict[str, Any]:
    lay, model = plan.layout, plan.model
    return {
        "contract": {
            "id": plan.contract_id,
            "fingerprint": plan.fingerprint,
            "logprob_contract": plan.logprob_contract,
            "newer_contract": plan.newer_contract,
        },
        "model": {
            "name": model.name,
            "num_layers": model.num_layers,
            "num_attention_heads": model.num_attention_heads,
            "num_kv_heads": model.num_kv_heads,
            "intermediate_size": model.intermediate_size,
            "vocab_size": model.vocab_size,
            "padded_vocab_size": plan.padded_vocab,
        },
        "layout": {
            "train": {
                "tp": lay.tp,
                "pp": lay.pp,
                "cp": lay.cp,
                "cp_comm_type": plan.cp_comm_type,
                "dp": lay.dp,
                "ep": lay.ep,
                "world": lay.train_world,
            },
            "rollout": {"tp": lay.rollout_tp_size, "dp": lay.rollout_dp, "gpus": lay.rollout_gpus},
        },
        "env": plan.env,
        "sglang_args": list(plan.args("sglang")),
        **({"lora": _lora_json(plan.lora)} if plan.lora is not None else {}),
        "megatron_args": list(plan.args("megatron")),
        "miles_args": list(plan.args("miles")),
        "commands": {
            "rollout": list(plan.rollout_command),
            "trainer": list(plan.trainer_command),
            "you_add": [{"args": args, "what": what} for args, what in plan.you_add],
        },
        "needs_newer_sglang": [
            {"flag": f, "sglang_release": plan.sglang_release, "from": where}
            for f, where in plan.needs_newer_sglang
        ],
        "unproven_on_real_sglang": [
            {"op": op, "why": why} for op, why in plan.unproven_on_real_sglang
        ],
        "never_pass": [
            {"flag": r.args[0], "table": r.table, "source": r.source, "reason": r.reason}
            for r in plan.forbidden
        ],
        "rows": [
            {
                "table": r.table,
                "source": r.source,
                "value": r.value,
                "kind": r.kind,
                "args": list(r.args),
                "reason": r.reason,
                **({"note": r.note} if r.note else {}),
                **({"fork_only": True} if r.fork_only else {}),
            }
            for r in plan.rows
        ],
    }


def _lora_json(lora: Any) -> dict[str, Any]:
    return {
        "path": lora.path,
        "name": lora.name,
        "base_model": lora.base_model,
        "rank": lora.rank,
        "alpha": lora.alpha,
        "target_modules": list(lora.target_modules),
        "tensors": lora.tensors,
        "sglang_args": list(lora.sglang_args),
    }


def to_json(plan: LaunchPlan) -> str:
    return json.dumps(to_json_data(plan), indent=2) + "\n"


def to_shell(plan: LaunchPlan) -> str:
    lines = [
        f"# contractgen plan: {plan.contract_id} {plan.fingerprint} on {plan.model.name}",
        f"# {_layout_line(plan)}",
    ]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in plan.env.items()]
    for flag, where in plan.needs_newer_sglang:
        lines.append(f"# needs a newer SGLang than {plan.sglang_release}: {flag} (from {where})")
    for row in plan.forbidden:
        lines.append(f"# never pass {row.args[0]} ({row.table}): {row.reason}")
    for op, why in plan.unproven_on_real_sglang:
        lines.append(f"# real SGLang, not proven here: {op}: {why}")
    if plan.lora is not None:
        lines.append(f"# LoRA adapter checked: r={plan.lora.rank} alpha={plan.lora.alpha:g}")
    lines += [f"# add: {args} ({what})" for args, what in plan.you_add]
    lines.append(f"# SGLang alone (outside miles): {shlex.join(plan.rollout_command)}")
    lines.append(shlex.join(plan.trainer_command))
    return "\n".join(lines) + "\n"


FORMATS: Mapping[str, Callable[[LaunchPlan], str]] = {
    "text": to_text,
    "json": to_json,
    "shell": to_shell,
}
