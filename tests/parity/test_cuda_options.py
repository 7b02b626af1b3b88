"""--device cuda: rollout TPs are bounded by the visible GPUs (one GPU per rank). Checked on CPU by
pretending CUDA is there; the refusal happens before any worker starts."""

from __future__ import annotations

from click.testing import CliRunner

from contractgen.cli import main
from contractgen.commands import parity


def test_explicit_rollout_tp_beyond_the_gpus_exits_2(monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(parity, "_cuda_device_count", lambda: 2)
    result = CliRunner().invoke(
        main, ["parity", "--device", "cuda", "--layouts", "tp1", "--rollout-tps", "1,4"]
    )
    assert result.exit_code == 2, result.output
    assert "rollout TP=4 needs 4 CUDA devices; 2 visible" in result.output
