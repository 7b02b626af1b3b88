"""Export the JSON Schema (2020-12) of a contract file; committed as schema/contract.schema.json."""

from __future__ import annotations

import json
from pathlib import Path

from .models import Contract

SCHEMA_ID = "https://contractgen.dev/schema/contract.schema.json"
SCHEMA_FILE = Path(__file__).parent / "contract.schema.json"
CROSS_FIELD_NOTE = (
    "Structure only. Rules that relate fields to each other (TP sizes dividing heads, K splitting "
    "into whole tile subtrees, power-of-two TP under the fixed-tree all-reduce, runtime policy "
    "agreeing with kernel policy) are beyond JSON Schema: `contractgen check` enforces them."
)


def contract_json_schema() -> dict:
    schema = Contract.model_json_schema(mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "$comment": CROSS_FIELD_NOTE,
        **schema,
    }


def schema_json() -> str:
    return json.dumps(contract_json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
