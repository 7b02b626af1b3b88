"""A pack (``common.packing``) as megatron-core's THD ``PackedSeqParams``, plus what causal
attention over its paths needs (``SGLangPackedSeqParams``, ``thd_params``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from megatron.core.packed_seq_params import PackedSeqParams

from ..common.packing import Pack


@dataclass
class SGLangPackedSeqParams(PackedSeqParams):
    """megatron-core ``PackedSeqParams`` (``qkv_format="thd"``) plus what causal attention over a
    pack needs: global positions ``[T]`` and the paths (each a LongTensor of row indices).

    Built once per microbatch (``thd_params``, then ``to(device)``) and handed to every
    layer: what the layers derive from it (RoPE tables, the attention calls, int32 positions) is
    computed by the first layer and kept in ``memo``, so later layers run no host work for it."""

    positions: torch.Tensor | None = None
    paths: list[torch.Tensor] = field(default_factory=list)
    owned: list[torch.Tensor] = field(default_factory=list)
    """``owned[i]``: indices into ``paths[i]`` of the tokens whose query that path computes."""
    flat: bool = False
    """Every path is the row range ``cu_seqlens_q[i] .. cu_seqlens_q[i+1]`` in order and owns all
    its rows (no shared prefix): attention can run as one varlen call over the pack."""
    cu_seqlens_host: torch.Tensor | None = None
    """``cu_seqlens_q`` kept on the host (``to`` leaves it there): the attention kernels read the
    offsets as Python ints, and reading a device copy waits for the GPU, in every layer."""
    positions_contiguous: tuple[bool, ...] | None = None
    """Per path: whether its owned rows' positions run ``p0, p0 + 1, ...`` (decided on the host
    when the pack is built). The Triton attention backward needs that and otherwise checks it on
    the device, a host sync per layer; ``None``: unknown (the kernel checks)."""
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    """What layers derive from these params, computed once (``memoized``); a copy made by
    ``to`` or ``dataclasses.replace`` starts empty."""

    def memoized(self, key: object, compute: Callable[[], object]) -> object:
        """``compute()`` the first time ``key`` is asked for, the kept value after that (kept
        apart under ``torch.inference_mode``, whose tensors autograd refuses to save)."""
        key = (key, torch.is_inference_mode_enabled())
        try:
            return self.memo[key]
        except KeyError:
            value = self.memo[key] = compute()
            return value

    def to(self, device: str | torch.device) -> SGLangPackedSeqParams:
        """The same params with every index tensor on ``device`` (but ``cu_seqlens_host``).

        One host-to-device copy for all index tensors (positions, paths, owned) and one for the
        offsets, instead of one per tensor: a copy from pageable memory waits for the stream,
        so a pack of 32 sequences made 67 such waits."""
        host = [self.positions, *self.paths, *self.owned]
        sizes = [t.numel() for t in host]
        moved = list(torch.cat([t.reshape(-1).long() for t in host]).to(device).split(sizes))
        positions, rest = moved[0], moved[1:]
        paths, owned = rest[: len(self.paths)], rest[len(self.paths) :]
        cu_q = self.cu_seqlens_q.to(device)
        same = self.cu_seqlens_kv is self.cu_seqlens_q
        return dataclasses.replace(
            self,
            cu_seqlens_q=cu_q,
            cu_seqlens_kv=cu_q if same else self.cu_seqlens_kv.to(device),
            positions=positions.to(self.positions.dtype),
            paths=paths,
            owned=owned,
        )


def _runs_up(positions: torch.Tensor) -> bool:
    """Whether ``positions`` are ``p0, p0 + 1, ...`` (host tensor)."""
    n = positions.numel()
    return n < 2 or bool((positions[1:] - positions[:-1] == 1).all())


def thd_params(pack: Pack) -> SGLangPackedSeqParams:
    """``pack``'s THD params: its paths, each owning the rows no earlier path holds, and the
    row's padding as one more path from position 0 (every row has an owner; never read)."""
    seen: set[int] = set()
    owned: list[torch.Tensor] = []
    for path in pack.paths:
        mine = [i for i, t in enumerate(path.tolist()) if t not in seen]
        seen.update(path.tolist())
        owned.append(torch.tensor(mine, dtype=torch.long))
    # Padding tokens (row tail) form their own path starting at position 0 so every row
    # index has an owner; their outputs are never read.
    pad = torch.arange(pack.num_real_tokens, pack.token_ids.numel(), dtype=torch.long)
    paths = list(pack.paths)
    if pad.numel():
        paths.append(pad)
        owned.append(torch.arange(pad.numel(), dtype=torch.long))
    lengths = torch.tensor([0] + [p.numel() for p in paths])
    cu = torch.cumsum(lengths, 0).to(torch.int32)
    flat = all(
        torch.equal(p, torch.arange(int(a), int(b))) and o.numel() == p.numel()
        for p, o, a, b in zip(paths, owned, cu[:-1], cu[1:], strict=True)
    )
    contiguous = tuple(_runs_up(pack.positions[p[o]]) for p, o in zip(paths, owned, strict=True))
    return SGLangPackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        max_seqlen_q=int(lengths.max()),
        max_seqlen_kv=int(lengths.max()),
        positions=pack.positions,
        paths=paths,
        owned=owned,
        flat=flat,
        cu_seqlens_host=cu,
        positions_contiguous=contiguous,
    )
