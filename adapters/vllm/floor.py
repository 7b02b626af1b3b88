"""What the vLLM target takes from the floor under the targets: the model description, the gate's
seeded reference weights and checkpoint reading. The one module of this target that imports
another target's files: when the floor moves to ``adapters/common``, only these lines change."""

from __future__ import annotations

from ..sglang.checkpoint import check_checkpoint, load_checkpoint
from ..sglang.model import ModelArch, check_weights, random_weights

__all__ = ["ModelArch", "check_checkpoint", "check_weights", "load_checkpoint", "random_weights"]
