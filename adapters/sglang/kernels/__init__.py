"""The contract kernels moved to ``contractgen.adapters.kernels`` (one library for rollout and
trainer, backends chosen by device). This package keeps the old import paths working: the package
re-exports the public names and every old submodule name is the new module itself (same object, so
attributes set on one are seen through the other)."""

import importlib
import sys

from contractgen.adapters.kernels import *  # noqa: F403
from contractgen.adapters.kernels import __all__  # noqa: F401

_MOVED = (
    "_dtypes",
    "planted",
    "all_reduce",
    "attention",
    "linear",
    "logsoftmax",
    "matmul",
    "mlp",
    "norm",
    "reduce",
    "residual",
    "rope",
    "stock",
)
for _name in _MOVED:
    _mod = importlib.import_module(f"contractgen.adapters.kernels.{_name}")
    sys.modules[f"{__name__}.{_name}"] = _mod
    globals()[_name] = _mod
