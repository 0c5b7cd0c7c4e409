"""``healer doctor --json``: the report document, ``healer.doctor.v1`` (docs/doctor.md).

One ``DoctorCheck`` per finding, in the order the checks ran; ``status`` and ``exit_code`` are the
worst check's. ``data`` holds each check's details (its keys per check are documented in docs/doctor.md
and may grow within v1; a key removed or renamed is v2).
"""

from __future__ import annotations

from typing import Any, Final, Literal

import pydantic

from healer.schemas import base

SCHEMA: Final = "healer.doctor.v1"
CheckStatus = Literal["ok", "info", "warn", "fail"]


class DoctorCheck(pydantic.BaseModel):
    model_config = base.CONFIG

    id: str = pydantic.Field(min_length=1, max_length=64, description="stable check name, e.g. nvml.fields")
    status: CheckStatus
    gpu: int | None = pydantic.Field(default=None, ge=0, description="the GPU a per-GPU check is about")
    summary: str = pydantic.Field(description="what was found, one line")
    fix: str | None = pydantic.Field(default=None, description="what to do; null when nothing")
    data: dict[str, Any] = pydantic.Field(default_factory=dict, description="the check's details")


class DoctorReport(base.WireModel):
    schema_: Literal["healer.doctor.v1"] = pydantic.Field(default=SCHEMA, alias="schema")
    node: str = pydantic.Field(min_length=1, max_length=253)
    ts: float = pydantic.Field(gt=0, description="when the checks ran, unix seconds")
    healer_version: str
    status: CheckStatus = pydantic.Field(description="the worst check's status")
    exit_code: Literal[0, 1, 2] = pydantic.Field(
        description="0 ok/info only, 1 some fail, 2 warn but no fail"
    )
    checks: list[DoctorCheck]
