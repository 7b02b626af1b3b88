"""Issue 32, the trainer's backward casts: the v3 trainer model (``bench_trainer``'s ``sglang``
row) with the kernel library's RMSNorm, RoPE and SiLU-GLU backwards and the carrier split as they
are, against the old functions (the backwards kept verbatim in
``tests/kernels/test_backward_widening.py``; the split: plain slicing): every gradient bit for
bit on the device (and the model against itself, to show the step is deterministic), then each
one's timed backward and the step's elementwise and copy kernels under ``torch.profiler``.

    python3 benchmarks/diag_backward_casts.py --device cuda --batch 32 --seq 512 --contract v3
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_trainer as bt  # noqa: E402


def _legacy_module():
    path = HERE.parent / "tests" / "kernels" / "test_backward_widening.py"
    spec = importlib.util.spec_from_file_location("legacy_backward", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _legacy_split_carrier(carrier, hidden_size):
    """``layers.split_carrier`` before: two slices, autograd's backward."""
    if carrier.shape[-1] == 2 * hidden_size:
        return carrier[..., :hidden_size], carrier[..., hidden_size:]
    return carrier, None


@contextlib.contextmanager
def legacy(on: bool):
    """The old backwards and split in place of the library's while ``on``."""
    from contractgen.adapters.kernels import norm
    from contractgen.adapters.kernels.triton import mlp, rope
    from contractgen.adapters.megatron import layers, transformer_layer

    if not on:
        yield
        return
    old = _legacy_module()
    swaps = [
        (norm, "rms_norm_backward", old._legacy_rms_norm_backward),
        (mlp, "silu_glu_backward", old._legacy_silu_glu_backward),
        (rope, "rope_backward", old._legacy_rope_backward),
        (layers, "split_carrier", _legacy_split_carrier),
        (transformer_layer, "split_carrier", _legacy_split_carrier),
    ]
    kept = [(m, n, getattr(m, n)) for m, n, _ in swaps]
    try:
        for m, n, f in swaps:
            setattr(m, n, f)
        yield
    finally:
        for m, n, f in kept:
            setattr(m, n, f)


def grads_of(model, make_inputs, targets_fn) -> dict:
    model.train()
    model.zero_grad(set_to_none=True)
    bt.megatron_loss(model(**make_inputs()), targets_fn()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(bits(a[k]), bits(b[k])) for k in a)


def kernel_counts(model, make_inputs, targets_fn) -> dict:
    """Per training step: calls and ms of PyTorch's elementwise and copy kernels, all kernels."""
    rows = bt.profile_step(model, make_inputs, targets_fn, top=10_000)
    pick = {
        "elementwise (all at::native)": lambda k: "at::native" in k,
        "direct_copy / bf16 copy": lambda k: "copy_kernel" in k,
        "all kernels": lambda k: True,
    }
    return {
        name: (sum(r["calls"] for r in rows if f(r["kernel"])),
               sum(r["total_ms"] for r in rows if f(r["kernel"])))
        for name, f in pick.items()
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--contract", default="v3")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    from contractgen.adapters.megatron import runtime
    from contractgen.adapters.megatron.model import Layout, arch_for
    from contractgen.adapters.megatron.policy import model_profile_for

    contract = bt.CONTRACT_ALIASES.get(args.contract, args.contract)
    dims = next(d for d in model_profile_for(contract).checkpoints if d.name == "Qwen3-0.6B")
    arch = arch_for(contract, dims)
    if args.layers:
        arch = dataclasses.replace(arch, num_layers=args.layers)
    from contractgen.adapters.common.distributed import Rendezvous

    rendezvous = Rendezvous()  # the store the rank joins, served while it runs
    runtime.init_distributed(0, Layout(), rendezvous.port, device=args.device)
    dev = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, arch.vocab_size, (args.seq,), generator=g) for _ in range(args.batch)]
    model, make_inputs, targets_fn = bt.build_case("sglang", arch, dev, seqs, contract)
    print(f"{arch.name} {arch.num_layers} layers, {args.batch} x {args.seq} tokens, {contract}")

    new = grads_of(model, make_inputs, targets_fn)
    again = grads_of(model, make_inputs, targets_fn)
    with legacy(True):
        old = grads_of(model, make_inputs, targets_fn)
    print(f"bits: new == new again {same(new, again)}; new == old {same(new, old)} "
          f"({len(new)} gradients)")  # fmt: skip
    del new, again, old

    for on in (True, False, True, False):  # alternate, so drift hits both
        with legacy(on):
            r = bt.time_model("sglang", model, make_inputs, targets_fn, args.iters, dev)
        print(f"{'old' if on else 'new'}: fwd {r['forward_grad_s']:.4f} s  "
              f"bwd {r['backward_s']:.4f} s  peak {r.get('peak_gib', 0):.2f} GiB")  # fmt: skip
    if dev.type == "cuda":
        for on in (True, False):
            with legacy(on):
                counts = kernel_counts(model, make_inputs, targets_fn)
            for name, (calls, ms) in counts.items():
                print(f"{'old' if on else 'new'} step kernels, {name}: {calls} calls, {ms:.2f} ms")
    runtime.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
