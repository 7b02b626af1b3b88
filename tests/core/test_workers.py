"""How ranks start (``adapters/workers.py``): from a fork server, under the parent's environment
as it is when the rank starts, not as it was when the server started."""

from __future__ import annotations

import os

from contractgen.adapters.workers import rank_context, start_rank


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
