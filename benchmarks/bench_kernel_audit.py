"""What the kernel audit costs (``kernels.audit``: the gate's ``kernel_calls`` and ``--strict``).

1. Host cost per call of a registry lookup (``registry.kernel``) and of a ``contract_op`` entry
   point (``token_logprobs`` on one row), off and recording.
2. The reference rollout (TP=1, in this process, the default workload: prefill + decode + the
   prefill re-score) with the audit off, counting, and strict; best of ``--repeats``.

``python benchmarks/bench_kernel_audit.py [--device cuda] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import time
import timeit

import torch


def _per_call_ns(fn, number: int = 20000) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from contractgen.adapters.common.rollout import RolloutJob
    from contractgen.adapters.kernels import audit, logsoftmax, registry
    from contractgen.adapters.sglang.model import ModelArch, random_weights
    from contractgen.adapters.sglang.session import _run
    from contractgen.codegen.vendored import load_target

    cid = "qwen3_dense_true_on_policy_v1"
    kp = load_target("sglang").schema.kernel_policy_for(cid)
    dev = torch.device(args.device)
    row = torch.randn(1, 64, device=dev)
    ids = torch.zeros(1, dtype=torch.long, device=dev)
    lookup = lambda: registry.kernel("invariant_matmul", dev)  # noqa: E731

    def kernel_before_the_hook(op, device):  # registry.kernel's body before the audit existed
        return registry._resolve(registry.backend_for(device), op)

    unhooked = lambda: kernel_before_the_hook("invariant_matmul", dev)  # noqa: E731
    entry = lambda: logsoftmax.token_logprobs(row, ids, kp, 64)  # noqa: E731
    bare = lambda: logsoftmax.token_logprobs.__wrapped__(row, ids, kp, 64)  # noqa: E731
    print(f"device {dev}, torch {torch.__version__}, backend {registry.backend_for(dev)}")
    for _ in range(2):  # interleaved, twice: the difference is a few tens of ns
        print(f"registry.kernel before the hook:    {_per_call_ns(unhooked):8.0f} ns")
        print(f"registry.kernel lookup, off:        {_per_call_ns(lookup):8.0f} ns")
    with audit.recording():
        print(f"registry.kernel lookup, recording:  {_per_call_ns(lookup):8.0f} ns")
    print(f"token_logprobs, 1 row, undecorated: {_per_call_ns(bare, 2000):8.0f} ns")
    print(f"token_logprobs, 1 row, off:         {_per_call_ns(entry, 2000):8.0f} ns")
    with audit.recording():
        print(f"token_logprobs, 1 row, recording:   {_per_call_ns(entry, 2000):8.0f} ns")

    arch = ModelArch.from_profile(load_target("sglang").schema.model_profile_for(cid))
    job = RolloutJob(cid, random_weights(arch, seed=0), 1, device=args.device)
    device_arg = args.device if args.device != "cpu" else None
    for mode in (None, "count", "strict"):
        times = []
        for _ in range(args.repeats + 1):  # the first run warms up (Triton compiles on CUDA)
            run = job if mode is None else RolloutJob(**{**job.__dict__, "kernel_audit": mode})
            t0 = time.perf_counter()
            result = _run(run, device=device_arg)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        calls = result.extra.get("kernel_calls")
        n = sum(calls.calls.values()) if calls else 0
        stock = len(calls.stock) if calls and calls.stock is not None else "-"
        print(
            f"rollout tp1 audit={mode!s:<6}: best {min(times[1:]):.3f} s of {args.repeats} "
            f"(contract-kernel calls {n}, stock-op entries {stock})"
        )


if __name__ == "__main__":
    main()
