"""``KernelPolicy``: the contract's kernel numerics as one typed, frozen value, defined once.

It is the generated class itself: the vendored ``schema.py`` that ``contractgen generate`` writes
for every target (the same bytes in each), loaded through ``codegen.vendored.load_target`` as the
sibling repos import it; no hand copy is kept here. ``kernel_policy`` converts a policy from
another source (another target's loaded copy of the class, the pydantic model, any object with
these attributes) at the place a side resolves its policy; nothing below that place converts
again.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

Dtype = Literal["bfloat16", "float16", "float32"]
"""A torch dtype attribute name (``dtype_of`` turns it into the dtype)."""


def _generated_class() -> type:
    """The generated ``KernelPolicy`` of the active project's first registered target (every
    target's ``schema.py`` is rendered from the same schema)."""
    from contractgen.codegen.targets import registry
    from contractgen.codegen.vendored import load_target

    return load_target(next(iter(registry()))).schema.KernelPolicy


KernelPolicy: Any = _generated_class()


def kernel_policy(policy: Any) -> Any:
    """A ``KernelPolicy`` from a generated policy (any target's copy), the pydantic model, or
    anything with these attributes; a ``KernelPolicy`` comes back as it is. A missing attribute
    raises ``AttributeError`` naming it: the source is older than this schema."""
    if isinstance(policy, KernelPolicy):
        return policy
    return KernelPolicy(
        **{f.name: getattr(policy, f.name) for f in dataclasses.fields(KernelPolicy)}
    )
