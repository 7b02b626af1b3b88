"""Packed sequences: several sequences (or a prefix tree of them) in one row, for every trainer.

A pack is a flat token row plus, per token, its RoPE position, and a list of *paths*: index lists
into the row whose tokens sit at positions ``0..len-1`` in order (a root-to-leaf path). Every
token is *owned* by the first path that contains it; attention for that token's query runs over
its owner path's keys only. Flat packing has one path per sequence (its rows ``offsets()[i] ..
offsets()[i + 1]``); a prefix tree shares the prompt's indices between the paths of all responses
to it. Because every other op is per token (batch-invariant matmul, per-row norms), the bits of a
token depend only on its path, so packed, tree-packed and unpacked forwards agree exactly.

How a target hands a pack to its model is its own: megatron-core's THD ``PackedSeqParams``
(``megatron/packing.py``: ``thd_params``), transformers' varlen keyword arguments
(``fsdp/runtime.py``: ``hf_inputs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Pack:
    """A packed row ready for the model, and how to read per-sequence results back out of it."""

    token_ids: torch.Tensor  # [T] int64, T padded to a multiple of the CP size
    positions: torch.Tensor  # [T] int64
    paths: list[torch.Tensor]  # per input sequence: its row indices, in position order
    num_real_tokens: int

    def offsets(self) -> torch.Tensor:
        """``[n + 1]`` int32: where each sequence's rows start in a flat pack, then the end of
        the last (the padding after it is no sequence's). A prefix tree has no such offsets."""
        lengths = [p.numel() for p in self.paths]
        if sum(lengths) != self.num_real_tokens:
            raise ValueError(
                "Pack.offsets: the pack shares rows between paths (a prefix tree); build it "
                "with pack_sequences(..., prefix_tree=False) or walk its paths"
            )
        return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def pack_sequences(
    sequences: Sequence[Sequence[int]],
    *,
    prompt_lens: Sequence[int] | None = None,
    prefix_tree: bool = False,
    pad_to_multiple: int = 1,
    pad_token_id: int = 0,
) -> Pack:
    """Pack ``sequences`` into one row.

    ``prefix_tree=True`` with ``prompt_lens`` stores each distinct prompt once: sequences whose
    first ``prompt_lens[i]`` tokens are identical share those rows (a prefix tree of depth one).
    ``pad_to_multiple`` pads the row (CP shards must be equal); padding tokens get their own path.
    """
    tokens: list[int] = []
    positions: list[int] = []
    paths: list[torch.Tensor] = []
    prompt_rows: dict[tuple[int, ...], list[int]] = {}
    for i, seq in enumerate(sequences):
        seq = [int(t) for t in seq]
        shared: list[int] = []
        start = 0
        if prefix_tree:
            if prompt_lens is None:
                raise ValueError("prefix_tree=True needs prompt_lens (one per sequence)")
            key = tuple(seq[: prompt_lens[i]])
            if key in prompt_rows:
                shared = prompt_rows[key]
                start = len(key)
            else:
                prompt_rows[key] = list(range(len(tokens), len(tokens) + len(key)))
        rows = list(shared)
        for pos in range(start, len(seq)):
            rows.append(len(tokens))
            tokens.append(seq[pos])
            positions.append(pos)
        paths.append(torch.tensor(rows, dtype=torch.long))
    real = len(tokens)
    total = -(-real // pad_to_multiple) * pad_to_multiple
    tokens += [pad_token_id] * (total - real)
    positions += list(range(total - real))
    return Pack(
        token_ids=torch.tensor(tokens, dtype=torch.long),
        positions=torch.tensor(positions, dtype=torch.long),
        paths=paths,
        num_real_tokens=real,
    )
