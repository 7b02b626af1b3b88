"""Which rows' log-sum-exp change when query heads share a tile (GQA ratio 3): the gpu test
``test_triton_attention_head_groups_keep_bits[rep3]`` found the outputs equal and the LSE not
(H200, 2026-12-02). Prints, per case, how many (query, head) LSE values differ from the row
computed one head per tile inside a prefill, and from the same call ungrouped, with the largest
difference in float32 ulps; one JSON line per case.

    python3 benchmarks/diag_head_group_lse.py
"""

from __future__ import annotations

import json

import torch

from contractgen.adapters.kernels.triton import attention as tatt
from contractgen.codegen.vendored import load_target


def _r(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.bfloat16).cuda()


def ulps(a, b):
    ia = a.contiguous().view(torch.int32).long()
    ib = b.contiguous().view(torch.int32).long()
    return int((ia - ib).abs().max())


def main() -> None:
    kp = load_target("sglang").schema.kernel_policy_for("qwen3_dense_true_on_policy_v1")
    for H, KVH in ((6, 2), (8, 2), (12, 4)):
        L = 150
        q, k, v = _r(L, H, 32), _r(L, KVH, 32, seed=1), _r(L, KVH, 32, seed=2)
        pos = torch.arange(L, device="cuda")
        full, full_lse = tatt.triton_attention_lse(q, k, v, pos, kp)
        for label, parts in (("decode", [(e - 1, e) for e in (1, 64, 65, 150)]),
                             ("chunks", [(99, 120), (50, 71)])):  # fmt: skip
            cu_q, cu_k = [0], [0]
            for q0, q1 in parts:
                cu_q.append(cu_q[-1] + q1 - q0)
                cu_k.append(cu_k[-1] + q1)
            args = (torch.cat([q[a:b] for a, b in parts]), torch.cat([k[:b] for _, b in parts]),
                    torch.cat([v[:b] for _, b in parts]), torch.cat([pos[a:b] for a, b in parts]))  # fmt: skip
            kw = dict(cu_seqlens_q=torch.tensor(cu_q), cu_seqlens_k=torch.tensor(cu_k))
            want_o = torch.cat([full[a:b] for a, b in parts])
            want = torch.cat([full_lse[a:b] for a, b in parts])
            for grouped in (True, False):
                tatt.GROUP_HEADS = grouped
                o, lse = tatt.triton_attention_lse(*args, kp, **kw)
                diff = (lse != want).nonzero().tolist()
                print(json.dumps({
                    "H": H, "KVH": KVH, "case": label, "grouped": grouped,
                    "o_equal": torch.equal(o, want_o), "lse_differ": len(diff),
                    "of": lse.numel(), "max_ulps": ulps(lse, want), "where": diff[:12],
                }), flush=True)  # fmt: skip
            tatt.GROUP_HEADS = True


if __name__ == "__main__":
    main()
