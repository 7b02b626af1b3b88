"""The SGLang-side kernels, imported from the one place the rollout imports them.

Forward values of every SGLang* layer come from these functions (``contractgen.adapters
.kernels``); this module only resolves them lazily so that importing the adapter does not require
the kernel package until a forward runs.
"""

from __future__ import annotations

import importlib
from types import ModuleType

_PACKAGE = "contractgen.adapters.kernels"


def kernel_module(name: str) -> ModuleType:
    """``kernel_module("matmul")`` -> ``contractgen.adapters.kernels.matmul``."""
    return importlib.import_module(f"{_PACKAGE}.{name}")
