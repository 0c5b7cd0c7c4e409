"""JSON Schema of every wire document, for docs/schemas/ and for other languages' consumers."""

from __future__ import annotations

import json
import pathlib

import pydantic

from healer.schemas import commands, events, incidents, telemetry

DOCUMENTS: dict[str, type[pydantic.BaseModel]] = {
    "node-frame.v1.json": telemetry.NodeFrame,
    "node-event.v1.json": events.NodeEvent,
    "command.v1.json": commands.Command,
    "command-result.v1.json": commands.CommandResult,
    "incident-event.v1.json": incidents.IncidentEvent,
    "rules-rejected-event.v1.json": incidents.RulesRejectedEvent,
}


def render() -> dict[str, str]:
    """File name → JSON Schema text (stable: sorted keys, trailing newline)."""
    out = {}
    for name, model in DOCUMENTS.items():
        schema = model.model_json_schema(by_alias=True, mode="validation")
        schema["$id"] = f"https://healer.invalid/schemas/{name}"
        out[name] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def write(directory: pathlib.Path) -> list[pathlib.Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render().items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written
