"""Aten ops of one training step, per layer: what a model's forward and backward issue (op,
output dtype, call count, bytes written), as the difference of a 2-layer and a 1-layer model, so
the embedding, head and loss cancel. Issue 32 used it to find the trainer backward's casts.

    CONTRACTGEN_KERNEL_BACKEND=triton TRITON_INTERPRET=1 \
        python3 benchmarks/count_step_ops.py --contract v3 --models sglang --sites
    python3 benchmarks/count_step_ops.py --contract v3 --models sglang,hf_sdpa

Models are ``bench_trainer``'s, on CPU at the contract's tiny reference model (2 x 64 tokens).
With the Triton backend under the interpreter the trainer runs the CUDA path's Python (its
kernels' launches are not aten ops; the interpreter's own ``copy_ uint8`` rows are its
argument copies, not the model's). ``--sites``: each row also names the line of this project,
megatron-core or transformers that issued it (or, for autograd's own nodes, the node).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_trainer as bt

ROOT = str(Path(__file__).resolve().parent.parent) + "/"
# ops that move no data (views, metadata, allocation without a fill)
FREE = {
    "detach", "view", "_unsafe_view", "t", "transpose", "expand", "slice", "select", "unsqueeze",
    "squeeze", "as_strided", "reshape", "split", "chunk", "permute", "alias", "split_with_sizes",
    "unbind", "empty_like", "empty", "new_empty", "new_empty_strided", "empty_strided",
    "is_same_size", "lift_fresh", "_local_scalar_dense", "set_", "promote_types",
    "_has_compatible_shallow_copy_type",
}  # fmt: skip
SITE_MARKS = ("megatron/core", "transformers/models")


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _site() -> str:
    frames = [
        f
        for f in traceback.extract_stack()[:-2]
        if (f.filename.startswith(ROOT) and "/.venv/" not in f.filename
            and not f.filename.endswith("count_step_ops.py"))
        or any(m in f.filename for m in SITE_MARKS)
    ]  # fmt: skip
    if frames:
        return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}"
    node = torch._C._current_autograd_node()
    return node.name() if node is not None else "?"


class OpCounter(TorchDispatchMode):
    """Counts each aten op by ``op dtype`` (copies: ``src->dst``) and the bytes it writes."""

    def __init__(self, sites: bool):
        super().__init__()
        self.sites = sites
        self.calls: collections.Counter = collections.Counter()
        self.bytes: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in FREE:
            return out
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
                if isinstance(o, torch.Tensor)]  # fmt: skip
        dtype = _short(outs[0].dtype) if outs else "-"
        if name in ("_to_copy", "copy_"):
            src = args[1] if name == "copy_" else args[0]
            key = f"{name} {_short(src.dtype)}->{dtype}"
        else:
            key = f"{name} {dtype}"
        if self.sites:
            key = f"{key} @{_site()}"
        self.calls[key] += 1
        self.bytes[key] += sum(o.numel() * o.element_size() for o in outs)
        return out


def count_step(name, arch, contract, seqs, sites: bool) -> tuple[OpCounter, OpCounter]:
    """``(forward, backward)`` counters of one training step of ``bench_trainer``'s ``name``."""
    model, make_inputs, targets_fn = bt.build_case(name, arch, torch.device("cpu"), seqs, contract)
    loss_of = getattr(model, "loss", bt.megatron_loss)
    inputs, targets = make_inputs(), targets_fn()
    model.train()
    model.zero_grad(set_to_none=True)
    fwd, bwd = OpCounter(sites), OpCounter(sites)
    with fwd:
        loss = loss_of(model(**inputs), targets)
    with bwd:
        loss.backward()
    return fwd, bwd


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contract", default="v3")
    ap.add_argument("--models", default="sglang,hf_sdpa")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--sites", action="store_true")
    args = ap.parse_args(argv)
    from contractgen.adapters.megatron import runtime
    from contractgen.adapters.megatron.model import Layout, arch_for

    contract = bt.CONTRACT_ALIASES.get(args.contract, args.contract)
    models = args.models.split(",")
    from contractgen.adapters.common.distributed import Rendezvous

    rendezvous = Rendezvous()  # the store the rank joins, served while it runs
    runtime.init_distributed(0, Layout(), rendezvous.port, device="cpu")
    base = arch_for(contract)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, base.vocab_size, (args.seq,), generator=g) for _ in range(args.batch)]
    per_layer = {}
    for name in models:
        one, two = (
            count_step(name, dataclasses.replace(base, num_layers=n), contract, seqs, args.sites)
            for n in (1, 2)
        )
        for phase, i in (("fwd", 0), ("bwd", 1)):
            a, b = one[i], two[i]
            per_layer[name, phase] = {
                k: (b.calls[k] - a.calls[k], b.bytes[k] - a.bytes[k])
                for k in set(a.calls) | set(b.calls)
                if b.calls[k] != a.calls[k]
            }
    runtime.shutdown()
    print(f"{base.name}: hidden {base.hidden_size}, intermediate {base.intermediate_size}, "
          f"{args.batch} x {args.seq} tokens, {contract}")  # fmt: skip
    width = 80 if args.sites else 42
    for phase in ("fwd", "bwd"):
        print(f"\n== {phase}, per layer: calls, KiB written")
        print(f"{'op':<{width}}" + "".join(f"{m:>20}" for m in models))
        keys = sorted(set().union(*(per_layer[m, phase] for m in models)))
        total = {m: [0, 0] for m in models}
        for k in keys:
            row = f"{k:<{width}}"
            for m in models:
                n, nbytes = per_layer[m, phase].get(k, (0, 0))
                total[m][0] += n
                total[m][1] += nbytes
                row += f"{n:>8} {nbytes / 1024:>10.1f}K" if n else f"{'-':>20}"
            print(row)
        print(f"{'TOTAL':<{width}}"
              + "".join(f"{total[m][0]:>8} {total[m][1] / 1024:>10.1f}K" for m in models))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
