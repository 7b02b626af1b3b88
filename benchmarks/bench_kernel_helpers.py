"""What bench_kernels.py and the scripts built on it (tune_matmul.py, linear_host_overhead.py,
bench_kernels_attention.py) measure with: the timer, seeded bf16 tensors, the per-tile mimic of
SGLang's matmul, a scratch SGLang module loader, and the peak extra memory of one call."""

from __future__ import annotations

import importlib.util
import statistics
import time

import torch

CONTRACT = "qwen3_dense_true_on_policy_v1"
# (name, N = out features, K = in features): Qwen3-4B at TP=1
SHAPES = [
    ("q_proj", 4096, 2560),
    ("k_proj/v_proj", 1024, 2560),
    ("o_proj", 2560, 4096),
    ("gate_proj/up_proj", 9728, 2560),
    ("down_proj", 2560, 9728),
]
SMALL_SHAPES = [("q_small", 128, 256), ("down_small", 64, 384)]


class Timer:
    def __init__(self, device: str):
        self.cuda = device == "cuda"

    def ms(self, fn, reps: int = 50) -> float:
        if self.cuda:
            from triton.testing import do_bench

            return do_bench(fn, warmup=10, rep=reps, return_mode="median")
        fn()
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)

    def kernel_ms(self, fn) -> float:
        """The kernels' device time alone (``kernel_time.kernel_ms``: no host work, no gaps
        between launches); nan off CUDA."""
        if not self.cuda:
            return float("nan")
        from kernel_time import kernel_ms

        return kernel_ms(fn)

    def both(self, row: dict, sdpa, ours) -> None:
        """``row``'s timings of the stock call and ours: whole calls (``do_bench``) and kernels
        alone, with their ratios."""
        row["sdpa_ms"], row["triton_ms"] = self.ms(sdpa), self.ms(ours)
        row["time_ratio"] = row["triton_ms"] / row["sdpa_ms"]
        row["sdpa_kernel_ms"], row["triton_kernel_ms"] = self.kernel_ms(sdpa), self.kernel_ms(ours)
        row["kernel_time_ratio"] = row["triton_kernel_ms"] / row["sdpa_kernel_ms"]

    def graph_ms(self, fn, rep_ms: int = 50) -> float:
        """Time ``fn`` replayed from a CUDA graph (how SGLang runs decode) for about ``rep_ms``
        milliseconds: the GPU's time without the host's launch cost. ``fn`` must not
        synchronize or copy from the host."""
        from triton.testing import do_bench_cudagraph

        return do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")


def _r(*shape, device, seed=0, scale=1.0):
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=device) * scale).to(torch.bfloat16)


def mimic_matmul(x, w, kp):
    """Per 128-wide K tile ``torch.mm(out_dtype=float32)`` (bf16 tensor cores), rounded to bf16,
    combined in the contract's order: what SGLang's kernel was measured to compute."""
    from contractgen.adapters.kernels.matmul import combine_tiles

    kb = kp.matmul_k_block
    parts = [
        torch.mm(x[:, i : i + kb], w[:, i : i + kb].T, out_dtype=torch.float32).to(x.dtype)
        for i in range(0, x.shape[1], kb)
    ]
    return combine_tiles(parts, kp.matmul_tile_order)


def load_sglang(path):
    if not path:
        return None
    spec = importlib.util.spec_from_file_location("sglang_tpinv_scratch", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _peak(fn, dev):
    if dev != "cuda":
        fn()
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**30
