"""``--lora`` with data parallelism, microbatches and the distributed optimizer (issue 34): the
trainer's gradient buffer, sharded AdamW and DP replica check hold the adapter branches alone,
and every step stays exact with the adapter handshake."""

from __future__ import annotations

import pytest
from conftest import run_parity

QWEN = "qwen3_dense_lora_true_on_policy_v1"


@pytest.mark.slow  # one dp2 run, 2 steps of 4 samples x 3 tokens: ~13 s
def test_lora_dp2_microbatches_distributed_optimizer_is_exact(tmp_path) -> None:
    from contractgen.adapters.common.lora import random_adapter
    from contractgen.codegen.vendored import load_target
    from contractgen.parity.targets import rollout_adapter

    code, report, out = run_parity(
        "--contract", QWEN, "--lora", "4", "--train-steps", "2", "--layouts", "dp2",
        "--rollout-tps", "1", "--new-tokens", "3", "--requests", "1",
        "--train-microbatches", "2", "--train-distributed-optimizer", "--no-grad-check",
        tmp_path=tmp_path,
    )  # fmt: skip
    assert code == 0, out
    training = report["training"]
    assert training["microbatches"] == 2 and training["distributed_optimizer"] is True
    schema = load_target("sglang").schema
    arch = rollout_adapter().ModelArch.from_profile(schema.model_profile_for(QWEN))
    modules = tuple(schema.CONTRACT_DATA[QWEN]["lora"]["target_modules"])
    adapter_elements = sum(
        t.numel() for k, t in random_adapter(arch, modules, 4, 6.0).items() if k != "lora.alpha"
    )
    digests = []
    for step in report["steps"]:
        assert step["exact"] and step["ratio_max_abs_dev"] == 0.0, step["step"]
        assert step["dp_replicas_identical"] and step["adapter_synced"], step["step"]
        (entry,) = step["per_layout"]
        assert entry["trained"]["trainable"] == adapter_elements  # A and B alone train
        assert entry["adapter"]["served"] == {"tp1": entry["adapter"]["pushed"]}
        digests.append(entry["adapter"]["pushed"])
    assert report["steps"][1]["push"]["adapter_only"] and digests[0] != digests[1]
