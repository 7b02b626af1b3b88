"""Run the gate: rollout vs trainer logprobs, bitwise, per pairing; faults; HF reference.

The TP=1 rollout is the reference: the rollout runs at every rollout TP the gate is given and
the trainer (megatron-core module tree with the contract's layers) at every (TP, PP, CP) layout;
every scored response token's logprob is compared by bit pattern (``bits``: +0.0 is not -0.0)
for every (rollout TP, trainer layout) pair, against the rollout logprobs the contract's logprob
contract names. A mismatch is located by comparing each layer's output on both sides. With
faults, each field is flipped on one side and must make some layout differ; planted shared-kernel
bugs must be caught by the cross-TP comparison or by the transformers reference.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from .faults import Fault, SharedBug, catalogue, flipped, left_out_reason, shared_bugs
from .layouts import Layout
from .rollout import DEFAULT_WORKLOAD, PromptSpec, RolloutJob, RolloutResult, RolloutSession
from .targets import adapter, rollout_target

# Which rollout logprobs the trainer must equal, by the contract's logprob contract.
ROLLOUT_LOGPROBS: dict[str, Callable[[RolloutResult], list[torch.Tensor]]] = {
    "sglang_prefill": lambda r: r.prefill_logprobs,
    "decode": lambda r: r.decode_logprobs,
}


def _say(message: str) -> None:
    print(f"parity: {message}", file=sys.stderr, flush=True)


@dataclass
class Comparison:
    exact: bool
    """Every scored logprob has the same bit pattern on both sides, and there was one at least."""
    tokens_compared: int
    max_abs_diff: float
    first: tuple[int, int] | None  # (sequence, scored token) of the first difference


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bit patterns as signed integers of its width: +0.0 and -0.0 differ, as do NaNs of
    other payloads (``torch.equal`` on the values calls the first equal and every NaN unequal)."""
    return t.contiguous().view(INT_OF_WIDTH[t.element_size()])


INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_digest(logprobs: list[torch.Tensor]) -> str:
    """sha256 of the logprobs' bit patterns, sequence by sequence (dtype and shape included): two
    runs with one digest scored every token with the same bits (a refactor's before/after too)."""
    h = hashlib.sha256()
    for t in logprobs:
        t = t.detach().cpu()
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        h.update(bits(t).numpy().tobytes())
    return h.hexdigest()


def compare(rollout: list[torch.Tensor], trainer: list[torch.Tensor]) -> Comparison:
    """Bit-pattern comparison of per-sequence scored logprobs (dtype included). Nothing to
    compare is not exact: an empty comparison proves nothing."""
    n, worst, first, exact = 0, 0.0, None, True
    for i, (a, b) in enumerate(zip(rollout, trainer, strict=True)):
        n += a.numel()
        if a.shape != b.shape:
            raise ValueError(f"sequence {i}: rollout scored {a.shape}, trainer {b.shape}")
        same = a.dtype == b.dtype and torch.equal(bits(a), bits(b))
        if not same:
            exact = False
            diff = (a.double() - b.double()).abs()
            diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
            worst = max(worst, float(diff.max()))
            if first is None:
                bad = (
                    bits(a) != bits(b) if a.dtype == b.dtype else torch.ones_like(diff, dtype=bool)
                )
                first = (i, int(bad.nonzero()[0, 0]) if bad.any() else 0)
    return Comparison(exact and n > 0, n, worst, first)


@dataclass
class GateConfig:
    contract_id: str
    weights: Any  # HF state dict or checkpoint dir
    layouts: list[Layout]
    dtype_override: str | None = None
    device: str = "cpu"
    inject_faults: bool = False
    progress: bool = True
    rollout_tps: list[int] = field(default_factory=lambda: [1])
    """Rollout TP sizes; TP=1 (always run) is the reference every other run is compared with."""
    workload: tuple[PromptSpec, ...] = DEFAULT_WORKLOAD
    hf_reference: bool = True
    """Compare with transformers' float32 forward at every layout (when transformers imports)."""
    grads: bool = False
    planted_bugs: tuple[str, ...] = ()
    """Shared-kernel bugs switched on on BOTH sides for the whole run (the gate's self-test)."""
    training: Any = None
    """A ``training.TrainingConfig``: run the gate over RL steps instead (``--train-steps``)."""
    strict: bool = False
    """``--strict``: the scored runs also watch for stock ops the contract replaces
    (``kernel_audit``); any seen fails the gate."""
    trainers: tuple[str, ...] = ()
    """Trainer targets to run (``--trainers``), each paired with the rollout; empty: every
    trainer target whose generated policy has the contract (``targets.trainer_targets``)."""
    rollouts: tuple[str, ...] = ()
    """Rollout targets besides the reference engine (``--rollouts``; ``rollout_targets.py``)."""

    @property
    def trainer_targets(self) -> tuple[str, ...]:
        from .targets import trainer_targets

        return self.trainers or tuple(trainer_targets(self.contract_id))


@dataclass
class GateRun:
    """Cached baseline runs and live process sessions, so each fault re-runs only its side."""

    config: GateConfig
    rollouts: dict[int, RolloutResult] = field(default_factory=dict)
    trainers: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    _rollout_sessions: dict[int, RolloutSession] = field(default_factory=dict)
    _trainer_sessions: dict[str, Any] = field(default_factory=dict)
    kernel_calls: dict[tuple[str, str], Any] = field(default_factory=dict)
    """(side, rollout ``tpN`` or layout name) -> the scored run's ``KernelCalls``."""
    trainer_target: str = ""
    """The trainer target the trainer calls run on (``use_trainer``); default the first."""

    def __post_init__(self) -> None:
        if not self.trainer_target:
            self.trainer_target = self.config.trainer_targets[0]

    @property
    def several_trainers(self) -> bool:
        return len(self.config.trainer_targets) > 1

    def use_trainer(self, name: str) -> None:
        """Run later trainer calls on target ``name`` (rollouts and their cache are shared)."""
        self.trainer_target = name

    @property
    def trainer_adapter(self):
        """The current trainer target's adapter module (``ROLE_API["trainer"]``)."""
        return adapter(self.trainer_target)

    @property
    def layouts(self) -> list[Layout]:
        """The configured layouts the current trainer target runs (``targets.runs_layout``)."""
        from .targets import runs_layout

        return [lay for lay in self.config.layouts if runs_layout(self.trainer_target, lay)]

    def layout_key(self, layout: Layout) -> str:
        """``layout``'s name for the current trainer: the bare name for the first trainer target
        (a one-trainer report keeps its shape), ``<target>/<name>`` for the others."""
        if self.trainer_target == self.config.trainer_targets[0]:
            return layout.name
        return f"{self.trainer_target}/{layout.name}"

    def trainer_label(self, layout: Layout) -> str:
        """``trainer tp2pp1cp1``, or ``<target> tp2pp1cp1`` when several trainers run."""
        who = self.trainer_target if self.several_trainers else "trainer"
        return f"{who} {layout.trainer_label}"

    @property
    def kernel_audit(self) -> str:
        """What the scored (baseline) runs record: ``kernels.audit`` mode."""
        return "strict" if self.config.strict else "count"

    def __enter__(self) -> GateRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def release(self, layout: Layout) -> None:
        """Stop a layout's trainer processes (memory: one layout's trainer ranks at a time)."""
        session = self._trainer_sessions.pop(self.layout_key(layout), None)
        if session is not None:
            session.close()

    def close(self) -> None:
        for session in [*self._rollout_sessions.values(), *self._trainer_sessions.values()]:
            session.close()
        self._rollout_sessions.clear()
        self._trainer_sessions.clear()

    @property
    def logprob_contract(self) -> str:
        from ..codegen.vendored import load_target

        schema = load_target(rollout_target()).schema
        return schema.get_contract_schema(self.config.contract_id).logprob_contract

    def release_rollout(self, tp: int) -> None:
        """Stop a rollout TP size's processes (its cached results stay)."""
        session = self._rollout_sessions.pop(tp, None)
        if session is not None:
            session.close()

    def rollout_session(self, tp: int) -> RolloutSession:
        """The live rollout processes at ``tp`` (started on first use)."""
        if tp not in self._rollout_sessions:
            self._rollout_sessions[tp] = RolloutSession(tp, self.config.device)
        return self._rollout_sessions[tp]

    def rollout(self, tp: int, **changes: Any) -> RolloutResult:
        """The rollout at ``tp`` (cached when unchanged); ``changes`` are ``RolloutJob`` fields."""
        baseline = not changes
        if baseline and tp in self.rollouts:
            return self.rollouts[tp]
        fields = {
            "dtype_override": self.config.dtype_override,
            "planted_bugs": self.config.planted_bugs,
            **changes,
            **({"kernel_audit": self.kernel_audit} if baseline else {}),
        }
        job = RolloutJob(
            self.config.contract_id, self.config.weights, tp, workload=self.config.workload,
            device=self.config.device, **fields,
        )  # fmt: skip
        result = self.rollout_session(tp).run(job)
        if baseline:
            self.rollouts[tp] = result
            self.kernel_calls["rollout", f"tp{tp}"] = result.extra.get("kernel_calls")
        return result

    def _trainer_session(self, layout: Layout):
        key = self.layout_key(layout)
        if key not in self._trainer_sessions:
            session = self.trainer_adapter.TrainerSession(
                self.config.contract_id, self.config.weights, layout,
                device=self.config.device,
            )  # fmt: skip
            session.start()
            self._trainer_sessions[key] = session
        return self._trainer_sessions[key]

    def trainer(
        self,
        layout: Layout,
        fault=None,
        dump_layers: bool = False,
        rollout: RolloutResult | None = None,
    ):
        """(scored logprobs per sequence, layer dumps or None) of the trainer at ``layout``, on
        the sequences of ``rollout`` (default: the unfaulted reference rollout, TP=1)."""
        TrainerRun = self.trainer_adapter.TrainerRun

        key = self.layout_key(layout)
        default = rollout is None
        if default and key in self.trainers and fault is None and not dump_layers:
            return self.trainers[key], None
        base = self.rollout(1) if default else rollout
        run = TrainerRun(
            dtype_override=self.config.dtype_override, fault=fault, dump_layers=dump_layers,
            planted_bugs=self.config.planted_bugs, sampling=tuple(base.sampling) or None,
        )  # fmt: skip
        if default and fault is None and not dump_layers:  # the scored run: audited
            import dataclasses

            run = dataclasses.replace(run, kernel_audit=self.kernel_audit)
        result = self._trainer_session(layout).logprobs(base.sequences, run)
        scored = [lp[p - 1 :] for lp, p in zip(result.logprobs, base.prompt_lens, strict=True)]
        if default and fault is None and not dump_layers:
            self.trainers[key] = scored
            self.kernel_calls["trainer", key] = result.kernel_calls
        return scored, result.layer_dumps

    def trainer_run(self, layout: Layout, sequences: list[list[int]], run):
        """One ``TrainerRun`` at ``layout`` on ``sequences`` (the gate's planted bugs added)."""
        import dataclasses

        run = dataclasses.replace(run, planted_bugs=self.config.planted_bugs + run.planted_bugs)
        return self._trainer_session(layout).logprobs(sequences, run)

    def scored_rollout(self, result: RolloutResult) -> list[torch.Tensor]:
        return ROLLOUT_LOGPROBS[self.logprob_contract](result)


def first_divergence(
    run: GateRun,
    layout: Layout,
    first: tuple[int, int],
    *,
    trainer_fault=None,
    rollout_changes: dict | None = None,
) -> dict:
    """Name the first layer whose output differs between the two sides, for one sequence.

    Both sides are re-run with per-layer dumps under the same faults as the compared runs.
    """
    seq_i, tok = first
    changes = rollout_changes or {}
    base = run.rollout(layout.tp, **changes)
    dumped = run.rollout(layout.tp, dump_layers=True, **changes)
    _, trainer_dumps = run.trainer(layout, fault=trainer_fault, dump_layers=True, rollout=base)
    rollout_layers = dumped.layer_dumps[seq_i] if dumped.layer_dumps else []
    trainer_layers = trainer_dumps[seq_i] if trainer_dumps else {}
    for i, r in enumerate(rollout_layers):
        t = trainer_layers.get(f"layer.{i}")
        if t is None:
            continue
        t = t[: r.shape[0]]
        if r.shape != t.shape or r.dtype != t.dtype or not torch.equal(r, t):
            rows = ((r.double() - t.double()).abs().sum(-1) != 0).nonzero()
            row = int(rows[0, 0]) if rows.numel() else 0
            col = (
                int(((r[row].double() - t[row].double()) != 0).nonzero()[0, 0])
                if rows.numel()
                else 0
            )
            return {
                "layer": i,
                "module": f"decoder.layers.{i}",
                "token_index": row,
                "rollout": float(r[row, col]),
                "trainer": float(t[row, col]),
            }
    scored_r = run.scored_rollout(base)[seq_i]
    scored_t = run.trainer(layout, fault=trainer_fault, rollout=base)[0][seq_i]
    return {
        "layer": None,
        "module": "final_norm/lm_head/log_softmax",
        "token_index": base.prompt_lens[seq_i] - 1 + tok,
        "rollout": float(scored_r[tok]),
        "trainer": float(scored_t[tok]),
    }


def pair_name(rollout_tp: int, layout: Layout, run: GateRun | None = None) -> str:
    trainer = run.trainer_label(layout) if run is not None else f"trainer {layout.trainer_label}"
    return f"rollout tp{rollout_tp} \u00d7 {trainer}"


def same_tokens(a: RolloutResult, b: RolloutResult) -> bool:
    return a.sequences == b.sequences


def trainer_for(run: GateRun, layout: Layout, rollout: RolloutResult) -> list[torch.Tensor]:
    """The trainer's scored logprobs at ``layout`` on ``rollout``'s sequences (the cached run on
    the reference sequences when they are the same tokens)."""
    if same_tokens(rollout, run.rollout(1)):
        return run.trainer(layout)[0]
    return run.trainer(layout, rollout=rollout)[0]


def run_rollouts(run: GateRun) -> dict:
    """Every rollout TP against the TP=1 reference: same token ids (greedy and seeded sampling
    alike), and bitwise the same decode and prefill logprobs."""
    ref = run.rollout(1)
    per_tp = []
    for tp in run.config.rollout_tps:
        t0 = time.perf_counter()
        res = run.rollout(tp)
        same = same_tokens(res, ref)
        entry = {"tp": tp, "tokens_identical": same, "logprobs_exact": same, "max_abs_diff": 0.0}
        if same:
            for pick in (lambda r: r.decode_logprobs, lambda r: r.prefill_logprobs):
                cmp = compare(pick(ref), pick(res))
                entry["logprobs_exact"] &= cmp.exact
                entry["max_abs_diff"] = max(entry["max_abs_diff"], cmp.max_abs_diff)
        else:
            entry["max_abs_diff"] = None
        entry["decode_sha256"] = bits_digest(res.decode_logprobs)
        entry["prefill_sha256"] = bits_digest(res.prefill_logprobs)
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        if run.config.progress:
            how = "same tokens" if same else "OTHER TOKENS"
            exact = "exact" if entry["logprobs_exact"] else "logprobs DIFFER"
            _say(f"rollout tp{tp} vs tp1: {how}, {exact} ({entry['seconds']} s)")
        per_tp.append(entry)
    return {
        "rollout_tokens_identical": all(e["tokens_identical"] for e in per_tp),
        "rollouts": per_tp,
    }


def run_layouts(run: GateRun, ref=None, grad_ref=None) -> dict:
    """Per trainer layout: the rollout at that layout's TP vs the trainer (``layouts``, with the
    first divergence); every (rollout TP, trainer layout) pair (``pairs``); with ``ref``, the
    trainer in float32 vs transformers (``reference``); with ``grad_ref``, gradients vs float64
    (``grads``). A layout's trainer processes are released before the next layout starts."""
    from .correctness import layout_grads, trainer_reference

    out, pairs, reference, grads = [], [], [], []
    for layout in run.layouts:
        t0 = time.perf_counter()
        if run.config.progress:
            ep = "".join(f" {k}={v}" for k, v in (("DP", layout.dp), ("EP", layout.ep)) if v > 1)
            _say(
                f"layout {run.layout_key(layout)}: trainer TP={layout.tp} PP={layout.pp} CP={layout.cp}{ep}"
            )
        own = run.rollout(layout.tp)
        scored = trainer_for(run, layout, own)
        cmp = compare(run.scored_rollout(own), scored)
        entry = {
            "name": run.layout_key(layout),
            "target": run.trainer_target,
            **layout.sizes,
            "exact": cmp.exact,
            "tokens_compared": cmp.tokens_compared,
            "max_abs_diff": cmp.max_abs_diff,
            "logprobs_sha256": bits_digest(scored),
            "first_divergence": (
                None if cmp.first is None else first_divergence(run, layout, cmp.first)
            ),
            "seconds": round(time.perf_counter() - t0, 2),
        }
        for tp in run.config.rollout_tps:
            r = run.rollout(tp)
            pc = compare(run.scored_rollout(r), trainer_for(run, layout, r))
            pairs.append(
                {
                    "name": pair_name(tp, layout, run),
                    "rollout_tp": tp,
                    "trainer": layout.sizes,
                    "target": run.trainer_target,
                    "exact": pc.exact,
                    "max_abs_diff": pc.max_abs_diff,
                    "tokens_compared": pc.tokens_compared,
                }
            )
        if run.config.progress:
            bad = [p["name"] for p in pairs[-len(run.config.rollout_tps) :] if not p["exact"]]
            _say(
                f"layout {layout.name}: {'exact' if cmp.exact else 'DIFFERS'} over "
                f"{cmp.tokens_compared} tokens; pairs with rollout tp{run.config.rollout_tps}: "
                f"{'all exact' if not bad else 'DIFFER: ' + ', '.join(bad)} ({entry['seconds']} s)"
            )
        out.append(entry)
        if ref is not None:
            reference.append(trainer_reference(run, ref, layout))
            if run.config.progress:
                _say(
                    f"layout {run.layout_key(layout)}: vs transformers {reference[-1]['max_abs_diff']:.3g}"
                )
        if grad_ref is not None:
            grads.append(layout_grads(run, grad_ref, layout))
            if run.config.progress:
                g = grads[-1]
                how = f"max rel {g['max_rel_diff']:.3g}" if g["supported"] else "not supported"
                _say(f"layout {run.layout_key(layout)}: gradients vs float64: {how}")
        run.release(layout)
    return {"layouts": out, "pairs": pairs, "reference": reference, "grads": grads}


def _policies_at(run: GateRun, layout: Layout, rollout_tp: int | None = None):
    """(kernel, rollout runtime, trainer runtime) policies in force at ``layout`` (the rollout
    at ``rollout_tp``, default the layout's TP)."""
    from ..codegen.vendored import load_target

    cid = run.config.contract_id
    trainer = load_target(run.trainer_target)
    kp = trainer.schema.kernel_policy_for(cid)
    sg = load_target(rollout_target()).runtime_policy.policy_for(
        cid, SimpleNamespace(tp_size=layout.tp if rollout_tp is None else rollout_tp)
    )
    mg = trainer.runtime_policy.policy_for(
        cid,
        SimpleNamespace(
            tensor_model_parallel_size=layout.tp,
            context_parallel_size=layout.cp,
            cp_comm_type="a2a",
            batch_invariant_mode=True,
        ),
    )
    return kp, sg, mg


def fault_change(
    run: GateRun, fault: Fault, layout: Layout, rollout_tp: int | None = None
) -> dict[str, Any]:
    """``{field: flipped value}`` of ``fault`` on the policies in force at ``layout`` (the
    rollout's at ``rollout_tp``)."""
    kp, sg, mg = _policies_at(run, layout, rollout_tp)
    owner = kp if fault.kind == "kernel" else {"rollout": sg, "trainer": mg}[fault.side]
    return {fault.field: flipped(fault.field, getattr(owner, fault.field), fault.kind)}


def _try_fault(
    run: GateRun,
    fault: Fault,
    layout: Layout,
    faulted_rollouts: dict | None = None,
    rollout_tp: int | None = None,
) -> tuple[str, str]:
    """("detected" | "undetected" | "error", how) for one fault at one layout (a rollout fault
    with the rollout at ``rollout_tp``, default the layout's TP: the pair the gate compares).

    ``faulted_rollouts`` (``run_faults``' cache, keyed by fault and rollout TP) lets layouts of
    one TP size share one faulted rollout; both sides are deterministic, so re-running it would
    give the same bits."""
    TrainerFault = run.trainer_adapter.TrainerFault

    tp = layout.tp if rollout_tp is None else rollout_tp
    where = layout.name if tp == layout.tp else f"{layout.name} with rollout tp{tp}"
    change = fault_change(run, fault, layout, tp)
    try:
        if fault.side == "rollout":
            # the faulted rollout may sample other tokens: the trainer scores what it sampled
            # (its cached unfaulted run when they are the reference tokens: ``trainer_for``)
            key = (fault.name, tp, tuple(sorted(change.items())))
            cache = {} if faulted_rollouts is None else faulted_rollouts
            if key not in cache:
                cache[key] = run.rollout(tp, **{f"{fault.kind}_changes": change})
            faulted = cache[key]
            rollout = run.scored_rollout(faulted)
            trainer = trainer_for(run, layout, faulted)
        else:
            tf = TrainerFault(**{f"{fault.kind}_policy": change})
            own = run.rollout(layout.tp)
            rollout = run.scored_rollout(own)
            trainer, _ = run.trainer(layout, fault=tf, rollout=own)
    except Exception as exc:  # reported, never counted as a detection
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        return "error", f"{where}: {type(exc).__name__}: {lines[-1][:160] if lines else ''}"
    cmp = compare(rollout, trainer)
    if cmp.exact:
        return "undetected", ""
    return "detected", f"{where}: max |diff| {cmp.max_abs_diff:.3g}"


def unobservable_notes(contract_id: str, run: GateRun | None = None) -> dict[str, str]:
    """The notes on fields the gate cannot observe: the contract's (from the generated schema),
    plus those ``run``'s trainer target declares for its own runtime policy (its adapter's
    ``UNOBSERVABLE``, true under every contract); a contract's own note wins."""
    from ..codegen.vendored import load_target

    notes = {}
    if run is not None:
        own = getattr(run.trainer_adapter, "UNOBSERVABLE", {})
        notes = {f"runtime_policy.{run.trainer_target}.{k}": v for k, v in own.items()}
    data = load_target(rollout_target()).schema.CONTRACT_DATA[contract_id]
    return notes | dict(data.get("unobservable", {}))


def _try_shared(run: GateRun, bug: SharedBug, ref, layout: Layout) -> tuple[str, str]:
    """A bug planted on both sides: detected when a rollout TP>1 differs from TP=1 under it, or
    when the rollout (TP=1) or the trainer (``layout``) disagrees with transformers."""
    from .correctness import rollout_reference, trainer_reference

    planted = (bug.bug,)
    try:
        base = run.rollout(1, planted_bugs=planted)
        for tp in [t for t in run.config.rollout_tps if t > 1]:
            other = run.rollout(tp, planted_bugs=planted)
            if not same_tokens(base, other):
                return "detected", f"rollout tp{tp} sampled other tokens than tp1"
            cmp = compare(run.scored_rollout(base), run.scored_rollout(other))
            if not cmp.exact:
                return "detected", f"rollout tp{tp} vs tp1: max |diff| {cmp.max_abs_diff:.3g}"
        if ref is None:
            off = "--no-reference" if not run.config.hf_reference else "transformers not there"
            return "left out", (
                "a bug on both sides moves no rollout-vs-trainer bit and no rollout TP > 1 "
                f"differed from TP 1 (TPs {sorted(run.config.rollout_tps)}); the one check "
                f"left, transformers' forward, is off in this run ({off})"
            )
        for entry in (
            rollout_reference(run, ref, 1, planted),
            trainer_reference(run, ref, layout, planted),
        ):
            if not entry["within_tolerance"]:
                return "detected", f"{entry['name']} vs transformers: {entry['max_abs_diff']:.3g}"
    except Exception as exc:  # reported, never counted as a detection
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        return "error", f"{type(exc).__name__}: {lines[-1][:160] if lines else ''}"
    return "undetected", ""


def run_faults(run: GateRun, ref=None, trainer_only: bool = False) -> dict:
    """Flip each field on one side; a fault is tried layout by layout, cheapest first, until
    one differs. Layout-major, so only one layout's trainer processes are alive at a time.
    Then each shared-kernel bug is planted on both sides (``_try_shared``). ``trainer_only``
    (a second trainer target's run): its trainer-side faults alone, the kernel ones named by it.

    A fault no layout detects fails the gate unless the contract explains it under
    ``unobservable``; a fault the contract calls unobservable that IS detected fails it too.
    """
    # cheapest first; among layouts of one size, TP first (reduction-order faults need TP)
    layouts = sorted(run.layouts, key=lambda lay: (lay.world_size, -lay.tp, lay.name))
    kp, sg, mg = _policies_at(run, layouts[0])
    faults = catalogue(kp, sg, mg, rollout_target(), run.trainer_target, trainer_only)
    if trainer_only:
        faults = [f for f in faults if f.side == "trainer"]
    left_out = _left_out(run, layouts, faults)
    faults = [f for f in faults if f.name not in left_out]
    notes = unobservable_notes(run.config.contract_id, run)
    outcomes: dict[str, tuple[str, str]] = {f.name: ("undetected", "") for f in faults}
    faulted_rollouts: dict = {}  # (fault, rollout TP) -> its rollout, shared by layouts of one TP
    for layout in layouts:
        for tp in [t for t in run._rollout_sessions if t != layout.tp]:
            run.release_rollout(tp)  # memory: one rollout TP's processes at a time
        pending = [f for f in faults if outcomes[f.name][0] == "undetected"]
        for fault in pending:
            outcomes[fault.name] = _try_fault(run, fault, layout, faulted_rollouts)
        run.release(layout)
        if run.config.progress:
            left = sum(1 for o, _ in outcomes.values() if o == "undetected")
            _say(f"faults at {layout.name}: {len(pending)} tried, {left} not yet detected")
    _try_other_rollout_tps(run, faults, layouts[0], outcomes, faulted_rollouts)
    for bug in [] if trainer_only else shared_bugs():
        outcomes[bug.name] = _try_shared(run, bug, ref, layouts[0])
        faults.append(bug)
    run.close()
    unexplained = [
        f for f in faults
        if isinstance(f, Fault) and outcomes[f.name][0] == "undetected"
        and f.contract_path not in notes
    ]  # fmt: skip
    retried = _retry_on_large_workload(run, unexplained, layouts[0], outcomes)
    detected, undetected, explained, contradicted, errors, details = [], [], {}, [], {}, {}
    for i, fault in enumerate(faults):
        outcome, how = outcomes[fault.name]
        note = notes.get(fault.contract_path)
        if outcome == "left out":
            left_out[fault.name] = how
        elif outcome == "detected":
            detected.append(fault.name)
            if note is not None:
                contradicted.append(fault.name)
                how += f" (but the contract lists {fault.contract_path} as unobservable)"
        elif outcome == "error":
            errors[fault.name] = how
        elif note is not None:
            explained[fault.name] = note
            outcome = "explained"
        else:
            undetected.append(fault.name)
        if not how:
            how = f"no layout of {[lay.name for lay in layouts]} differs"
            if retried and fault.name in retried["faults"]:
                how += f", nor {retried['layout']} on the {retried['workload']} workload"
                if fault.side == "rollout" and len(retried.get("rollout_tps", [1])) > 1:
                    how += f" (rollout TPs {retried['rollout_tps']})"
        details[fault.name] = how
        if run.config.progress:
            _say(f"fault {i + 1}/{len(faults)} {fault.name}: {outcome} {how}".rstrip())
    return {
        "injected": len(faults),
        "detected": len(detected),
        "undetected": undetected,
        "explained": explained,
        "contradicted": contradicted,
        "errors": errors,
        "details": details,
        "retried": retried,
        "left_out": left_out,
    }


def _left_out(run: GateRun, layouts: list[Layout], faults: list[Fault]) -> dict[str, str]:
    """``{fault: why}`` for the kernel faults nothing in this run could show: each acts only
    across the ranks of one axis (``faults.AXIS_ONLY_FIELDS``) and its side runs none above 1.
    The trainer's sizes are its layouts'; the rollout's TP is any of the gate's rollout TPs
    (``_try_other_rollout_tps`` pairs them with a trainer layout), its EP the layouts'."""
    names = [lay.name for lay in layouts]
    trainer = {"tp": max(lay.tp for lay in layouts), "ep": max(lay.ep for lay in layouts)}
    rollout_tps = sorted({*run.config.rollout_tps, *(lay.tp for lay in layouts)})
    sides = {
        "trainer": (trainer, f"{run.trainer_target} layouts {', '.join(names)}"),
        "rollout": ({**trainer, "tp": max(rollout_tps)}, f"rollout TPs {rollout_tps}"),
    }
    out = {}
    for fault in faults:
        sizes, where = sides[fault.side]
        why = fault.kind == "kernel" and left_out_reason(fault.field, fault.side, sizes, where)
        if why:
            out[fault.name] = why
    return out


def _try_other_rollout_tps(
    run: GateRun, faults: list[Fault], layout: Layout, outcomes: dict, faulted_rollouts: dict
) -> None:
    """A rollout fault no layout showed at its own TP, tried with ``layout``'s trainer against
    the gate's other rollout TPs, largest first (pairs the gate compares too: ``pairs``). The
    rollout's cross-rank switches act only at TP > 1, and a trainer without TP (``fsdpN``)
    pairs with rollout TP 1 alone."""
    pending = [f for f in faults if f.side == "rollout" and outcomes[f.name][0] == "undetected"]
    own = {lay.tp for lay in run.layouts}
    for tp in sorted({*run.config.rollout_tps} - own, reverse=True):
        for fault in [f for f in pending if outcomes[f.name][0] == "undetected"]:
            outcomes[fault.name] = _try_fault(run, fault, layout, faulted_rollouts, tp)
        run.release_rollout(tp)
        if run.config.progress:
            left = sum(1 for f in pending if outcomes[f.name][0] == "undetected")
            _say(f"faults at {layout.name} with rollout tp{tp}: {left} not yet detected")
    run.release(layout)


def merged_faults(first: dict, other: dict) -> dict:
    """One ``faults`` section of two ``run_faults`` results (two trainer targets' runs)."""
    out = dict(first)
    for key in ("injected", "detected", "undetected", "contradicted"):
        out[key] = first[key] + other[key]
    for key in ("explained", "errors", "details", "left_out"):
        out[key] = {**first.get(key, {}), **other.get(key, {})}
    a, b = first.get("retried"), other.get("retried")
    if a and b:
        out["retried"] = {**a, "faults": a["faults"] + b["faults"],
                          "detected": a["detected"] + b["detected"]}  # fmt: skip
    else:
        out["retried"] = a or b
    return out


RETRY_WORKLOAD = "large"


def _retry_on_large_workload(
    run: GateRun, faults: list[Fault], layout: Layout, outcomes: dict[str, tuple[str, str]]
) -> dict | None:
    """Give each fault no layout detected a second chance at ``layout`` on the ``large``
    workload (when it is larger than the run's own), updating ``outcomes``.

    A reordered float32 reduction moves a float32 logprob by an ulp on a few percent of tokens
    (``logsoftmax_vocab_block`` under float32 logprobs: about 1 in 25), so the default 40 scored
    tokens can miss it; 256 cannot, in practice. Only the undetected, unexplained faults pay for
    the larger workload. A rollout fault still undetected there is tried once more with the
    rollout at the gate's largest TP: a cross-rank switch (a reduce-scatter's float32 order,
    one rounding later) acts only at TP > 1 and moves a bfloat16 value only where the two float32
    sums straddle a rounding boundary."""
    from dataclasses import replace

    from .rollout import arch_of
    from .workload import describe, fitted, scored_tokens

    config = run.config
    max_positions = arch_of(config.contract_id, config.weights).max_position_embeddings
    workload = fitted(RETRY_WORKLOAD, max_positions)
    if not faults or scored_tokens(workload) <= scored_tokens(config.workload):
        return None
    what = f"{layout.name} on the {RETRY_WORKLOAD} workload ({describe(RETRY_WORKLOAD)})"
    if config.progress:
        _say(f"faults: {len(faults)} undetected; trying them at {what}")
    top = max(config.rollout_tps, default=1)
    rollout_tps = [1, top] if top > 1 and any(f.side == "rollout" for f in faults) else [1]
    big = replace(config, workload=workload, layouts=[layout], rollout_tps=rollout_tps)
    with GateRun(big, trainer_target=run.trainer_target) as big_run:
        for fault in faults:
            outcome, how = _try_fault(big_run, fault, layout)
            if outcome == "undetected" and fault.side == "rollout" and top > 1:
                outcome, how = _try_fault(big_run, fault, layout, rollout_tp=top)
            if outcome != "undetected":
                outcomes[fault.name] = (outcome, f"{how}, on the {RETRY_WORKLOAD} workload")
    return {
        "workload": RETRY_WORKLOAD,
        "layout": layout.name,
        "rollout_tps": rollout_tps,
        "faults": [f.name for f in faults],
        "detected": [f.name for f in faults if outcomes[f.name][0] == "detected"],
    }
