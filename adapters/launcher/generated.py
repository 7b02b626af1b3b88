"""The generated modules the launcher reads, and nothing else.

Contract data reaches the launcher only through the generated (vendored) ``schema.py`` and the
per-target ``runtime_policy.py`` modules, the same code miles, SGLang and Megatron-LM vendor.
"""

from __future__ import annotations

from types import ModuleType

from contractgen.codegen.vendored import load_target


def schema() -> ModuleType:
    """The generated ``schema.py`` (byte-identical in every target; the launcher's copy)."""
    return load_target("launcher").schema


def runtime_policy(target: str) -> ModuleType:
    """The generated ``runtime_policy.py`` of ``target`` (sglang, megatron, launcher)."""
    return load_target(target).runtime_policy
