"""Count the calls that become host syncs on CUDA in one trainer forward + backward.

On CPU nothing syncs, but the calls that would are the same Python calls: reading a tensor's
value on the host (``item``, ``tolist``, ``__bool__``, ``__int__``, ``__float__``, ``__index__``,
``equal``, ``cpu``, ``numpy``), ops whose output size depends on values (``nonzero``, boolean-mask
indexing, ``repeat_interleave`` without ``output_size``, ``unique``, ``masked_select``) and tensors
built from Python data (``torch.tensor``: a pageable host-to-device copy, which waits for the
stream). ``SyncCounter`` (patches on ``torch`` and ``torch.Tensor``) records each such call made by the project's
code; calls on ``host`` tensors (the pack's ``cu_seqlens_host``, which stays on the host on CUDA)
are host reads, counted apart; calls made inside Triton's interpreter (its own copies to and from
the host) are left out.

Per layer vs per step: ``probe`` runs the same pack through a model of ``layers`` layers; what a
layer adds is the difference between two depths, so ``per_layer = (n(4) - n(2)) / 2`` and the
step's fixed part is ``n(2) - 2 * per_layer``.

    TRITON_INTERPRET=1 CONTRACTGEN_KERNEL_BACKEND=triton \\
        python tests/megatron/host_sync_probe.py qwen3_dense_true_on_policy_v1 2 4

prints one JSON line per depth: ``{"layers", "forward": {...}, "backward": {...}, ...}``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

# (owner, attribute) -> name: Python-level calls that read a value on the host or size an
# output by values. Patched on the classes, not seen through a ``TorchFunctionMode``: autograd
# runs a Python ``backward`` with the function modes off, and the backward is half the count.
_READS = {
    (torch.Tensor, "item"): "item",
    (torch.Tensor, "tolist"): "tolist",
    (torch.Tensor, "__bool__"): "__bool__",
    (torch.Tensor, "__int__"): "__int__",
    (torch.Tensor, "__float__"): "__float__",
    (torch.Tensor, "__index__"): "__index__",
    (torch.Tensor, "cpu"): "cpu",
    (torch.Tensor, "numpy"): "numpy",
    (torch.Tensor, "equal"): "equal",
    (torch, "equal"): "equal",
    (torch.Tensor, "nonzero"): "nonzero",
    (torch, "nonzero"): "nonzero",
    (torch.Tensor, "unique"): "unique",
    (torch, "unique"): "unique",
    (torch.Tensor, "masked_select"): "masked_select",
    (torch, "masked_select"): "masked_select",
    (torch, "tensor"): "torch.tensor",
}


def _bool_index(args) -> bool:
    idx = args[1] if len(args) > 1 else None
    items = idx if isinstance(idx, tuple) else (idx,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _sized_by_values(args, kwargs) -> bool:
    repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
    return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None


# (owner, attribute) -> (name, whether this call reads values): calls that only sometimes do
_SOMETIMES = {
    (torch.Tensor, "__getitem__"): ("bool_index", lambda a, k: _bool_index(a)),
    (torch.Tensor, "repeat_interleave"): ("repeat_interleave", _sized_by_values),
    (torch, "repeat_interleave"): ("repeat_interleave", _sized_by_values),
}


def _in_triton_interpreter() -> bool:
    f = sys._getframe(2)
    while f is not None:
        if "site-packages/triton/" in f.f_code.co_filename:
            return True
        f = f.f_back
    return False


def _caller(filename: str) -> str:
    """``adapters/megatron/attention.py`` for a file of the project's adapters, else the name."""
    parts = Path(filename).parts
    return (
        "/".join(parts[parts.index("adapters") :]) if "adapters" in parts else Path(filename).name
    )


class SyncCounter:
    """While entered, counts would-be host syncs (``syncs``) and host-tensor reads
    (``host_reads``) by name, forward and backward alike (the calls are patched on ``torch`` and
    ``torch.Tensor``; the originals are restored on exit)."""

    def __init__(self, host: list[torch.Tensor]) -> None:
        self.host = {t.untyped_storage().data_ptr() for t in host if t is not None}
        self.syncs: Counter[str] = Counter()
        self.host_reads: Counter[str] = Counter()
        self.callers: Counter[str] = Counter()
        """Would-be syncs by the calling file (``adapters/...`` relative; others by name)."""
        self._saved: list[tuple[object, str, object]] = []

    def _record(self, name: str, args) -> None:
        if _in_triton_interpreter():
            return
        t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if t is not None and t.untyped_storage().data_ptr() in self.host:
            self.host_reads[name] += 1
        else:
            self.syncs[name] += 1
            self.callers[_caller(sys._getframe(2).f_code.co_filename)] += 1

    def _wrap(self, fn, name, when=None):
        def counted(*args, **kwargs):
            if when is None or when(args, kwargs):
                self._record(name, args)
            return fn(*args, **kwargs)

        return counted

    def __enter__(self) -> SyncCounter:
        for (owner, attr), name in _READS.items():
            fn = getattr(owner, attr)
            self._saved.append((owner, attr, fn))
            setattr(owner, attr, self._wrap(fn, name))
        for (owner, attr), (name, when) in _SOMETIMES.items():
            fn = getattr(owner, attr)
            self._saved.append((owner, attr, fn))
            setattr(owner, attr, self._wrap(fn, name, when))
        return self

    def __exit__(self, *exc) -> None:
        for owner, attr, fn in reversed(self._saved):
            setattr(owner, attr, fn)
        self._saved.clear()


def probe(
    contract_id: str,
    layers: int,
    lengths=(70, 9, 33),
    prefix_tree: bool = False,
    known_positions: bool = True,
):
    """One forward (with grad) and backward of a ``layers``-layer tiny model over one pack:
    ``{"forward": {...}, "backward": {...}, "host_reads": {...}}`` call counts, and the
    logprobs and gradients. ``known_positions=False`` drops the pack's host-side contiguity
    flags (``positions_contiguous``), as the params carried none before: the Triton backward
    then checks on the device (the twin: one sync per layer that the count must see)."""
    from megatron_reference import random_sequences, tiny_arch, weights_for
    from megatron_testing import single_process_megatron

    from contractgen.adapters import kernels
    from contractgen.adapters.common.packing import pack_sequences
    from contractgen.adapters.megatron.checkpoint import load_into
    from contractgen.adapters.megatron.model import (
        Layout,
        build_model,
        make_config,
        padded_vocab_size,
    )
    from contractgen.adapters.megatron.packing import thd_params
    from contractgen.adapters.megatron.policy import generated

    arch = tiny_arch(contract_id, num_layers=layers)
    kp = generated().schema.kernel_policy_for(contract_id)
    # a pack of its own per depth (the first sequence one token longer per layer): the kernels
    # keep their block tables per pack, so every probe builds them once, as a training step does
    lengths = (lengths[0] + layers, *lengths[1:])
    seqs = random_sequences(lengths, arch.vocab_size, seed=1)
    prompt_lens = [min(5, len(s) - 1) for s in seqs]
    if prefix_tree:  # two responses share each prompt
        seqs = [s for s in seqs for _ in range(2)]
        seqs = [s[:p] + s[p:][::-1] if i % 2 else s for i, (s, p) in
                enumerate(zip(seqs, [p for p in prompt_lens for _ in range(2)], strict=True))]  # fmt: skip
        prompt_lens = [p for p in prompt_lens for _ in range(2)]
    with single_process_megatron():
        config = make_config(contract_id, arch, Layout())
        padded = padded_vocab_size(arch, 1, kp)
        torch.manual_seed(0)
        model = build_model(config, arch, pre_process=True, post_process=True,
                            padded_vocab_size=padded)  # fmt: skip
        load_into(model, weights_for(arch, seed=0), arch, tp_rank=0, tp_size=1,
                  padded_vocab_size=padded)  # fmt: skip
        model.train()
        pack = pack_sequences(seqs, prefix_tree=prefix_tree, prompt_lens=prompt_lens)
        params = thd_params(pack).to("cpu")
        if not known_positions:
            params = dataclasses.replace(params, positions_contiguous=None)
        targets = torch.roll(pack.token_ids, -1)
        host = [params.cu_seqlens_host]
        fwd, bwd = SyncCounter(host), SyncCounter(host)
        with fwd:
            logits = model(
                input_ids=pack.token_ids[None], position_ids=pack.positions[None],
                attention_mask=None, packed_seq_params=params,
            )  # fmt: skip
            lp = kernels.logsoftmax.vocab_parallel_token_logprobs(
                logits[0], targets, 0, arch.vocab_size, config.true_on_policy.kp
            )
            loss = -lp.float().sum()
        with bwd:
            loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {
        "layers": layers,
        "forward": dict(sorted(fwd.syncs.items())),
        "backward": dict(sorted(bwd.syncs.items())),
        "host_reads": dict(sorted((fwd.host_reads + bwd.host_reads).items())),
        "callers": dict(sorted((fwd.callers + bwd.callers).items())),
        "logprobs": lp.detach(),
        "grads": grads,
    }


def counts_only(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in ("logprobs", "grads")}


def _bits(t: torch.Tensor) -> torch.Tensor:
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.contiguous().view(ints[t.element_size()])


def same_bits(a: dict, b: dict) -> bool:
    """Whether two probes' logprobs and every gradient have the same bit patterns."""
    if (
        not torch.equal(_bits(a["logprobs"]), _bits(b["logprobs"]))
        or a["grads"].keys() != b["grads"].keys()
    ):
        return False
    return all(torch.equal(_bits(a["grads"][n]), _bits(b["grads"][n])) for n in a["grads"])


def main(argv: list[str]) -> None:
    """``CONTRACT DEPTH... [--twin] [--prefix-tree] [--short]``: one JSON line per depth; with
    ``--twin`` one more at the last depth without the contiguity flags, with ``same_bits``
    (against the last depth's run: the flags may change no bit)."""
    contract, *rest = argv
    tree, short = "--prefix-tree" in rest, "--short" in rest
    lengths = (20, 9) if short else (70, 9, 33)
    depths = [int(d) for d in rest if d.isdigit()]
    last = None
    for d in depths:
        last = probe(contract, d, lengths, prefix_tree=tree)
        print(json.dumps(counts_only(last)), flush=True)
    if "--twin" in rest:
        r = probe(contract, depths[-1], lengths, prefix_tree=tree, known_positions=False)
        print(json.dumps({**counts_only(r), "twin": True, "same_bits": same_bits(last, r)}))


if __name__ == "__main__":
    main(sys.argv[1:])
