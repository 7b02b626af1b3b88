"""LoRA support: the largest admitted rank lowered from 64 to 32 under the shipped LoRA id (an
adapter of rank 48 that ran under it would now be refused). The base adds a frozen copy of the
LoRA contract, so the golden's line numbers do not move when the shipped one is edited."""

import shutil
from pathlib import Path

from breaking_support import generate, replace

LORA = "contracts/qwen3_dense_lora_true_on_policy_v1.yaml"


def base(root):
    shutil.copy(Path(__file__).parent / Path(LORA).name, root / LORA)
    generate(root)


def mutate(root):
    replace(root, LORA, "  max_rank: 64\n", "  max_rank: 32\n")
