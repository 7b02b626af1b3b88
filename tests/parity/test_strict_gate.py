"""`parity --strict` and the report's `kernel_calls`: evidence that the contract's kernels ran.

The one-layout gate runs in this process (its TP=1 rollout too), so a monkeypatch here swaps one
contract op for the stock op on the rollout side only; the trainer's ranks are untouched. To
reach spawned ranks, a ``sitecustomize`` on the gate process's PYTHONPATH makes the swap in
every interpreter (the fork server the ranks come from included).
"""

from __future__ import annotations

import pytest
from conftest import run_parity, run_parity_in_process

CHEAP = ("--layouts", "tp1", "--rollout-tps", "1", "--no-reference")
KINDS = {  # each kind of op the contract replaces: a contract op of it ran on each side
    "rollout": {
        "invariant_matmul",
        "chunked_attention",
        "rms_norm",
        "token_logprobs",
        "full_logprobs",
    },
    "trainer": {
        "invariant_matmul",
        "chunked_attention_lse",
        "rms_norm",
        "vocab_parallel_token_logprobs",
    },
}


def _stock_log_softmax(monkeypatch) -> None:
    """The rollout's scored logprobs by ``torch.log_softmax`` (the stock twin, in the contract's
    dtype) instead of the contract's ``token_logprobs``."""
    from contractgen.adapters.kernels import stock
    from contractgen.adapters.sglang import engine

    def stock_token_logprobs(logits_TV, ids_T, kp, vocab_size):
        return stock.stock_token_logprobs(
            logits_TV, ids_T, kp, vocab_size, dtype=kp.logsoftmax_dtype
        )

    monkeypatch.setattr(engine, "token_logprobs", stock_token_logprobs)


@pytest.mark.slow
def test_strict_passes_the_honest_gate_and_fails_a_stock_log_softmax(tmp_path, monkeypatch):
    """The honest gate with --strict exits 0: no stock op on the scored path, and on each side
    every kind of op the contract replaces ran through a contract kernel. Then one contract op
    swapped for the stock op on one side: --strict exits 1 naming the op, the side and the
    layout; without --strict the report's count of that op on that side drops from the honest
    run's to 0, and the other side's counts do not move (counting is the same in both modes)."""
    code, honest, out = run_parity_in_process(*CHEAP, "--strict", tmp_path=tmp_path)
    assert code == 0, out
    before = honest["kernel_calls"]
    assert before["strict"] is True and before["stock_ops"] == [] and before["missing"] == []
    assert set(before["rollout"]) == {"tp1"} and set(before["trainer"]) == {"tp1"}
    for side, ops in KINDS.items():
        calls = before[side]["tp1"]
        assert ops <= set(calls), (side, calls)
        assert all(calls[op] > 0 for op in ops), (side, calls)
    # one scored re-score per request (the packed prefill scores them one by one)
    assert before["rollout"]["tp1"]["token_logprobs"] == honest["workload"]["requests"]
    assert "--strict: no stock op on the scored path" in out

    _stock_log_softmax(monkeypatch)
    code, report, out = run_parity_in_process(*CHEAP, "--strict", tmp_path=tmp_path)
    assert code == 1, out
    stock = report["kernel_calls"]["stock_ops"]
    assert {(e["side"], e["layout"], e["op"], e["stock"]) for e in stock} == {
        ("rollout", "tp1", "token_logprobs", "torch.log_softmax")
    }, stock
    assert stock[0]["calls"] == honest["workload"]["requests"]
    assert (
        "--strict: rollout tp1 rank 0: stock torch.log_softmax ran 4 time(s) outside every "
        "contract kernel (the contract's op: token_logprobs)" in out
    )

    code, report, out = run_parity_in_process(*CHEAP, tmp_path=tmp_path)
    after = report["kernel_calls"]
    assert after["strict"] is False and after["stock_ops"] is None and "--strict" not in out
    assert "token_logprobs" not in after["rollout"]["tp1"], after["rollout"]
    assert after["rollout"]["tp1"]["full_logprobs"] > 0  # the sampler's log-softmax still ran
    assert after["trainer"] == before["trainer"]  # the other side: the same calls


# Imported by every interpreter of the gate's process tree: the trainer's dense linears become
# megatron's own ``torch.matmul`` (the stock op ``batch_invariant_mode`` selects when off).
TRAINER_STOCK_MATMUL = """
from contractgen.adapters.megatron import layers

layers.MATMUL_BY_BATCH_INVARIANT_MODE[True] = layers._stock_matmul
"""


@pytest.mark.slow
def test_strict_sees_stock_ops_in_spawned_ranks_and_counts_every_rank(tmp_path, monkeypatch):
    """Across processes: the trainer's TP=2 ranks (spawned) report the stock matmul each, by
    rank; the rollout's TP=2 ranks' counts are all in the report (twice the TP=1 run's)."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(TRAINER_STOCK_MATMUL)
    monkeypatch.setenv("PYTHONPATH", str(inject))
    code, report, out = run_parity(
        "--layouts", "tp2", "--rollout-tps", "1,2", "--no-reference", "--strict",
        tmp_path=tmp_path, fresh=True,
    )  # fmt: skip
    assert code == 1, out
    kc = report["kernel_calls"]
    seen = {(e["side"], e["layout"], e["rank"], e["op"], e["stock"]) for e in kc["stock_ops"]}
    assert seen == {("trainer", "tp2", r, "invariant_matmul", "torch.matmul") for r in (0, 1)}
    assert "--strict: trainer tp2 rank 1: stock torch.matmul ran" in out
    one, two = kc["rollout"]["tp1"], kc["rollout"]["tp2"]
    assert set(one) == set(two) and all(two[op] == 2 * one[op] for op in one), (one, two)


def test_strict_is_refused_with_train_steps(tmp_path):
    code, _, out = run_parity_in_process("--train-steps", "1", "--strict", tmp_path=tmp_path)
    assert code == 2, out
    assert "--strict cannot be combined with --train-steps" in out


def test_strict_report_names_stock_ops_and_kinds_no_contract_kernel_ran():
    """``kernel_audit`` on a finished run's records (no processes): a stock op by rank, a run
    with no contract call of a kind, a run that recorded nothing; without --strict, none fail."""
    from types import SimpleNamespace

    from contractgen.adapters.kernels.audit import KernelCalls
    from contractgen.parity import kernel_audit

    full = {"invariant_matmul": 3, "chunked_attention": 1, "rms_norm": 2, "token_logprobs": 1}
    stock = [{"rank": 0, "op": "rms_norm", "stock": "torch.nn.functional.rms_norm", "calls": 2}]
    records = {
        ("rollout", "tp1"): KernelCalls(full, []),
        ("trainer", "tp2"): KernelCalls({**full, "rms_norm": 0}, [{**stock[0], "rank": 1}], 2),
        ("trainer", "pp2"): None,
    }
    for strict in (True, False):
        run = SimpleNamespace(config=SimpleNamespace(strict=strict), kernel_calls=records)
        report = {"kernel_calls": kernel_audit.section(run)}
        assert list(report["kernel_calls"]["trainer"]) == ["tp2"]
        if not strict:
            assert kernel_audit.failures(report) == []
            assert report["kernel_calls"]["stock_ops"] is None
            continue
        assert kernel_audit.failures(report) == [
            "--strict: trainer tp2 rank 1: stock torch.nn.functional.rms_norm ran 2 time(s) "
            "outside every contract kernel (the contract's op: rms_norm)",
            "--strict: trainer tp2: no contract norm kernel ran (rms_norm: 0 calls)",
            "--strict: trainer pp2: its scored run recorded no calls",
        ]
        assert "          --strict: 3 problem(s), listed below" in kernel_audit.table(report)
