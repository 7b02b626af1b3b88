"""How ranks start (``adapters/common/workers.py``): from a fork server, under the parent's environment
as it is when the rank starts, not as it was when the server started."""

from __future__ import annotations

import os

from contractgen.adapters.common.workers import rank_context, start_rank


def _report_env(name: str, results) -> None:
    import sys

    results.put((os.environ.get(name), "torch" in sys.modules))


def test_a_rank_sees_the_environment_of_its_start_not_the_servers(monkeypatch):
    ctx = rank_context()
    results = ctx.Queue()
    monkeypatch.setenv("CONTRACTGEN_TEST_WORKER_ENV", "first")
    start_rank(ctx, _report_env, ("CONTRACTGEN_TEST_WORKER_ENV", results)).join(60)
    first, preloaded = results.get(timeout=60)
    monkeypatch.setenv("CONTRACTGEN_TEST_WORKER_ENV", "second")  # after the server started
    start_rank(ctx, _report_env, ("CONTRACTGEN_TEST_WORKER_ENV", results)).join(60)
    second, _ = results.get(timeout=60)
    monkeypatch.delenv("CONTRACTGEN_TEST_WORKER_ENV")
    start_rank(ctx, _report_env, ("CONTRACTGEN_TEST_WORKER_ENV", results)).join(60)
    gone, _ = results.get(timeout=60)
    assert (first, second, gone) == ("first", "second", None)
    assert preloaded  # the rank was forked with torch already imported


def _echo_rank(rank: int, commands, results, scale: int) -> None:
    import traceback

    while (command := commands.get()) is not None:
        if command == "exit" and rank == 1:
            os._exit(3)
        try:
            if command == "fail":
                raise ValueError(f"rank {rank} cannot do that")
            results.put((rank, "ok", command * scale + rank))
        except Exception:
            results.put((rank, "err", traceback.format_exc()))


def test_rank_pool_answers_fails_and_reports_a_dead_rank():
    import pytest

    from contractgen.adapters.common.workers import RankPool

    pool = RankPool("echo pool", 2, _echo_rank, (10,), timeout_s=60)
    try:
        replies = pool.send(4, "echo")
        assert replies == {0: ("ok", 40), 1: ("ok", 41)}
        assert pool.send(5, "echo") == {0: ("ok", 50), 1: ("ok", 51)}  # same ranks, kept alive
        with pytest.raises(RuntimeError, match="echo failed") as failed:
            pool.send("fail", "echo")
        assert "ValueError: rank 1 cannot do that" in str(failed.value)
        with pytest.raises(RuntimeError, match=r"echo pool: rank\(s\) \[1\] exited"):
            pool.send("exit", "echo")
        assert not pool.started  # a broken pool closes itself
    finally:
        pool.close()


def _many_tensors(n: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(0)
    out = {f"layers.{i}.w": torch.randn(3, 5, generator=g).to(torch.bfloat16) for i in range(n)}
    out["scalar"] = torch.tensor(2.5, dtype=torch.float64)
    out["ids"] = torch.arange(7)
    out["mask"] = torch.tensor([True, False, True])
    out["empty"] = torch.zeros(0, 4)
    return out


def _checksum_rank(weights, results) -> None:
    from contractgen.adapters.common.shared_tensors import SharedTensors

    tensors = weights.tensors() if isinstance(weights, SharedTensors) else weights
    results.put(
        {k: (str(v.dtype), tuple(v.shape), v.double().sum().item()) for k, v in tensors.items()}
    )


def test_shared_tensors_round_trip_bitwise():
    import torch

    from contractgen.adapters.common.shared_tensors import SharedTensors

    tensors = _many_tensors(5)
    back = SharedTensors.pack(tensors).tensors()
    assert list(back) == list(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape
        assert torch.equal(back[name], t), name


def test_a_fork_server_rank_receives_a_state_dict_of_any_size():
    """A 28-layer checkpoint has ~310 tensors; passed to a rank as a dict, each is its own file
    descriptor and the fork server refuses ("too many fds"). Packed, it is one."""
    import pytest

    from contractgen.adapters.common.shared_tensors import SharedTensors

    tensors = _many_tensors(400)
    ctx = rank_context()
    results = ctx.Queue()
    with pytest.raises(ValueError, match="too many fds"):
        start_rank(ctx, _checksum_rank, (tensors, results))
    start_rank(ctx, _checksum_rank, (SharedTensors.pack(tensors), results)).join(60)
    got = results.get(timeout=60)
    assert got == {
        k: (str(v.dtype), tuple(v.shape), v.double().sum().item()) for k, v in tensors.items()
    }


def test_shared_tensors_from_safetensors_files_equal_their_loaded_state_dict(tmp_path):
    """A checkpoint read tensor by tensor into the shared buffer (two files, as a sharded
    checkpoint) gives the tensors ``load_file`` gives, bitwise."""
    import torch
    from safetensors.torch import load_file, save_file

    from contractgen.adapters.common.shared_tensors import SharedTensors

    tensors = _many_tensors(6)
    names = list(tensors)
    files = [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]
    save_file({n: tensors[n] for n in names[:4]}, str(files[0]))
    save_file({n: tensors[n] for n in names[4:]}, str(files[1]))
    shared = SharedTensors.from_safetensors(files)
    assert shared.buffer.is_shared()
    back = shared.tensors()
    loaded = {**load_file(str(files[0])), **load_file(str(files[1]))}
    assert sorted(back) == sorted(loaded)
    for name, t in loaded.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape
        assert torch.equal(back[name], t), name
