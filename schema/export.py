"""Export the JSON Schema (2020-12) of a contract file; committed as schema/contract.schema.json."""

from __future__ import annotations

import json
from pathlib import Path

from .models import Contract

SCHEMA_ID = "https://contractgen.dev/schema/contract.schema.json"
SCHEMA_FILE = Path(__file__).parent / "contract.schema.json"


def contract_json_schema() -> dict:
    schema = Contract.model_json_schema(mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        **schema,
    }


def schema_json() -> str:
    return json.dumps(contract_json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
