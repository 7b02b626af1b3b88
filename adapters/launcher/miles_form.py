"""The launch in the form miles takes: one ``train.py`` command that starts SGLang itself.

miles registers SGLang's server arguments under its own prefix (``--attention-backend fa3`` is
``--sglang-attention-backend fa3`` on ``train.py``) and sets two of them itself: the model path
(from ``--hf-checkpoint``) and the TP size (from ``--rollout-num-gpus-per-engine``, which the plan
renders). Facts from radixark/miles ``main`` (``miles/backends/sglang_utils/arguments.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

SGLANG_PREFIX = "--sglang-"

# SGLang server arguments miles sets itself -> the miles argument they come from
SET_BY_MILES = {"--model-path": "--hf-checkpoint", "--tp-size": "--rollout-num-gpus-per-engine"}

# What a true-on-policy plan cannot know and a miles launch needs: (arguments, what they are)
YOU_ADD: tuple[tuple[str, str], ...] = (
    ("--hf-checkpoint PATH", "the Hugging Face checkpoint SGLang serves (the plan's model)"),
    (
        "--ref-load PATH --load PATH --save PATH",
        "the Megatron checkpoints: reference, resume, save",
    ),
    ("--actor-num-nodes N --actor-num-gpus-per-node N", "the training GPUs (their product: world)"),
    ("--prompt-data PATH --input-key KEY", "the prompts"),
    ("--rollout-batch-size N --n-samples-per-prompt N --num-rollout N", "the RL loop's sizes"),
    ("the model's architecture arguments", "--num-layers, --hidden-size, … as in miles' scripts"),
)


def _takes_value(args: Sequence[str], i: int) -> bool:
    return i + 1 < len(args) and not args[i + 1].startswith("--")


def sglang_args_for_miles(args: Sequence[str]) -> tuple[str, ...]:
    """SGLang server arguments as ``train.py`` takes them: each flag under ``--sglang-`` (a
    ``--no-X`` negative, which argparse derives from ``--X``, as ``--no-sglang-X``), the ones miles
    sets itself (``SET_BY_MILES``) left out with their values."""
    out: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        takes = _takes_value(args, i)
        if token in SET_BY_MILES:
            i += 2 if takes else 1
            continue
        if token.startswith("--no-"):  # argparse's negative of --X under a prefix: --no-sglang-X
            out.append("--no-" + SGLANG_PREFIX[2:] + token[5:])
        else:
            out.append(SGLANG_PREFIX + token[2:] if token.startswith("--") else token)
        i += 1
    return tuple(out)


def once(args: Sequence[str]) -> tuple[str, ...]:
    """``args`` with each flag (and its value) kept at its first place only; a flag given two
    different values is a ValueError (two tables disagreeing is a bug of the tables)."""
    out: list[str] = []
    seen: dict[str, tuple[str, ...]] = {}
    i = 0
    while i < len(args):
        group = tuple(args[i : i + 2]) if _takes_value(args, i) else (args[i],)
        i += len(group)
        if group[0] in seen:
            if seen[group[0]] != group:
                raise ValueError(f"{group[0]}: rendered as {seen[group[0]]} and as {group}")
            continue
        seen[group[0]] = group
        out += group
    return tuple(out)
