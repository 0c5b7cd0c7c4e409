"""JSON Schema of rule files, for editors (``healer rules schema``; committed as docs/schemas/rules.v1.json).

It describes structure only; expressions, metric names and units are checked by ``healer rules check``.
"""

from __future__ import annotations

import json
import pathlib

from healer.rules import spec

SCHEMA_ID = "https://healer.invalid/schemas/rules.v1.json"


def render() -> str:
    schema = spec.RuleFile.model_json_schema(by_alias=True, mode="validation")
    schema["$id"] = SCHEMA_ID
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "healer rule file"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write(path: pathlib.Path) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render())
    return path
