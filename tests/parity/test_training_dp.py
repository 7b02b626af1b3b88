"""``parity --train-steps`` at a data-parallel layout (``dp2``: two DP replicas, each with every
other sequence of the step in two microbatches, the gradient summed over DP in the fixed tree
order). The honest run, with the distributed optimizer (state sharded over the two ranks):
every step exact, ratio exactly 1, the loss bit for bit its ratio-1 value, the rollout holding
the pushed weights and both replicas' parameters bit-identical. The fault run, with the
replicated optimizer: the last DP rank skipping the reduction is named after step 0 (parameters
and fp32 main copies) and breaks the ratio at step 1 (its sequences are scored with drifted
weights). The two optimizers' steps are bit for bit the same (``tests/megatron/
test_data_parallel.py``)."""

from __future__ import annotations

import struct

import pytest
from conftest import run_parity

DP_RUN = (
    "--layouts", "dp2", "--rollout-tps", "1", "--new-tokens", "6", "--train-microbatches", "2",
    "--no-grad-check",
)  # fmt: skip


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


@pytest.mark.slow
def test_two_rl_steps_at_dp2_stay_bit_identical_with_synced_replicas(tmp_path):
    code, report, out = run_parity(
        "--train-steps", "2", *DP_RUN, "--train-distributed-optimizer", tmp_path=tmp_path
    )
    assert code == 0, out
    assert report["training"]["microbatches"] == 2
    assert report["training"]["distributed_optimizer"] is True
    for s in report["steps"]:
        (pair,) = s["pairs"]
        assert pair["name"] == "rollout tp1 \u00d7 trainer tp1pp1cp1dp2" and pair["exact"], pair
        assert pair["tokens_compared"] == 48  # 8 sequences x 6: both DP ranks' shares merged
        assert s["ratio_max_abs_dev"] == 0.0 and s["kl"] == 0.0
        assert s["weights_synced"] and s["dp_replicas_identical"]
        (e,) = s["per_layout"]
        assert e["dp"] == 2 and e["dp_mismatched"] == []
        assert _bits(e["loss"]) == _bits(e["loss_if_ratio_one"]), e
        got, want, bound = (e[f"advantage_logprob{k}"] for k in ("", "_want", "_bound"))
        assert abs(got - want) <= bound < 1e-4, (got, want, bound)
    assert out.count("1/1") == 2 and "NOT synced" not in out


@pytest.mark.slow
def test_a_desynchronised_dp_rank_is_named_and_breaks_the_next_step(tmp_path):
    code, report, out = run_parity(
        "--train-steps", "2", *DP_RUN, "--train-fault", "dp.desync_rank", tmp_path=tmp_path
    )
    assert code == 1, out
    first, second = report["steps"]
    assert first["exact"] and first["ratio_max_abs_dev"] == 0.0, "step 0 scores step-0 weights"
    assert not first["dp_replicas_identical"]
    (entry,) = first["per_layout"]
    assert "decoder.final_layernorm.weight#main" in entry["dp_mismatched"]
    assert "data-parallel replicas differ after the step" in out
    assert not second["exact"] and second["ratio_max_abs_dev"] > 0.0
