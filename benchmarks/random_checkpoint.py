"""Write a random-weight Hugging Face checkpoint shaped like one of a contract's checkpoints.

Nothing is downloaded: the dims come from the contract's model profile (e.g. ``Qwen3-0.6B``), the
weights from transformers' own initialisation of a fresh model (``--init transformers``: normal,
std ``initializer_range`` = 0.02, so a near-uniform next-token distribution that sampling can
explore) or from the gate's reference-model initialiser (``--init contractgen``: unit-variance
embeddings, which at 28 layers make a nearly deterministic sampler), and transformers'
``save_pretrained`` writes ``config.json`` + safetensors, so ``contractgen parity --checkpoint``
reads it as it would the real model.

    python benchmarks/random_checkpoint.py --contract qwen3_dense_true_on_policy_v1 \
        --name Qwen3-0.6B --out /tmp/qwen3-0.6b-random
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contract", default="qwen3_dense_true_on_policy_v1")
    parser.add_argument("--name", required=True, help="a checkpoint name of the contract's profile")
    parser.add_argument("--out", required=True, help="directory to write")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", default="transformers", choices=["transformers", "contractgen"])
    args = parser.parse_args()

    from contractgen.adapters.launcher.layout import UnknownModelError
    from contractgen.parity.random_model import write_random_checkpoint

    t0 = time.perf_counter()
    try:
        out, n = write_random_checkpoint(
            args.contract, args.name, args.out, seed=args.seed, dtype=args.dtype, init=args.init
        )
    except UnknownModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}: {args.name}, {n / 1e9:.3f} B parameters, {args.dtype}, "
          f"{args.init} init, {time.perf_counter() - t0:.1f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
