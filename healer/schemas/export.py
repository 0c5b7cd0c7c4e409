"""JSON Schema of every wire document, for docs/schemas/ and for other languages' consumers."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pydantic

from healer.schemas import (
    budgets,
    commands,
    doctor_report,
    events,
    incidents,
    shadow,
    stepreport,
    telemetry,
    verdicts,
)

DOCUMENTS: dict[str, type[pydantic.BaseModel]] = {
    "node-frame.v1.json": telemetry.NodeFrame,
    "node-frame.v2.json": telemetry.NodeFrame,
    "node-event.v1.json": events.NodeEvent,
    "command.v1.json": commands.Command,
    "command-result.v1.json": commands.CommandResult,
    "incident-event.v1.json": incidents.IncidentEvent,
    "rules-rejected-event.v1.json": incidents.RulesRejectedEvent,
    "verdict-event.v1.json": verdicts.VerdictEvent,
    "anomaly-shadow-event.v1.json": shadow.ShadowEvent,
    "step-report.v1.json": stepreport.StepReport,
    "power-shed.v1.json": budgets.ShedRequest,
    "power-shed-result.v1.json": budgets.ShedResult,
    "power-status.v1.json": budgets.PowerStatus,
    "doctor-report.v1.json": doctor_report.DoctorReport,
}


def render() -> dict[str, str]:
    """File name → JSON Schema text (stable: sorted keys, trailing newline)."""
    out = {}
    for name, model in DOCUMENTS.items():
        schema = model.model_json_schema(by_alias=True, mode="validation")
        if name == "node-frame.v1.json":
            schema = _frame_v1(schema)
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


def _frame_v1(schema: dict[str, Any]) -> dict[str, Any]:
    """The v1 NodeFrame: the current model without ``ports`` and ``fabric_manager_up`` (v2 added them),
    its schema field v1 only."""
    schema["properties"].pop("ports")
    schema["properties"].pop("fabric_manager_up")
    schema["$defs"].pop("PortSample")
    field = schema["properties"]["schema"]
    field.pop("enum")
    field["const"] = telemetry.SCHEMA
    field["type"] = "string"
    return schema
