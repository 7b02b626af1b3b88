"""What the vLLM target takes from the floor (``adapters/common``): the model description, the
gate's seeded reference weights and checkpoint reading."""

from __future__ import annotations

from ..common.checkpoint import check_checkpoint, load_checkpoint
from ..common.model import ModelArch, check_weights, random_weights

__all__ = ["ModelArch", "check_checkpoint", "check_weights", "load_checkpoint", "random_weights"]
