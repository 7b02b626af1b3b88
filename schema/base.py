"""What every contract model shares: the frozen, strict base class and the bounded scalar types.

Validate at the edge, trust inside: every model forbids unknown keys and is frozen.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1

Dtype = Literal["bfloat16", "float16", "float32"]
ContractId = Annotated[str, Field(pattern=r"^[a-z0-9_]+_v[0-9]+$", max_length=80)]
Identifier = Annotated[str, Field(pattern=r"^[a-z0-9_]+$", max_length=80)]
# Every size is bounded: 2**24 covers any real vocabulary, context length or width (with room),
# and keeps a hostile contract from making the tile-order proof or the generated tables huge.
MAX_SIZE = 2**24
PositiveInt = Annotated[int, Field(ge=1, le=MAX_SIZE)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
