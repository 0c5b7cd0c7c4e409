"""StepReport: one training step's time from one rank, as a job publishes it (#28, docs/fail-slow.md).

A job may report its iteration times (``healer.steps.StepReporter``, stdlib only) to
``<prefix>.steps.<job>`` (bus.subjects ``steps``); the controller uses them to confirm that a job a
straggler belongs to really runs slower, by how much and since when. ``compute_s`` (the part of the step
before the rank waits for its peers), when a job can measure it, names the outlier rank directly.
"""

from __future__ import annotations

from typing import Final, Literal

import pydantic

from healer import steps
from healer.schemas import base, telemetry

SCHEMA: Final = steps.SCHEMA
"""Written once, in the standard-library-only reporter that training scripts copy (``healer.steps``)."""
STEP_MAX_S: Final = 86_400.0
"""A step longer than a day is not a training iteration."""


class StepReport(base.WireModel):
    schema_: Literal["healer.steps.v1"] = pydantic.Field(default=SCHEMA, alias="schema")
    job: str = pydantic.Field(min_length=1, max_length=128, description="scheduler job id (SLURM_JOB_ID)")
    rank: int = pydantic.Field(ge=0, le=1_000_000, description="global rank of the reporting process")
    step: int | None = pydantic.Field(default=None, ge=0, description="iteration number")
    step_time_s: float = pydantic.Field(gt=0, le=STEP_MAX_S, description="wall time of the iteration")
    compute_s: float | None = pydantic.Field(
        default=None, ge=0, le=STEP_MAX_S, description="time computing before waiting for peers, if known"
    )
    node: str | None = pydantic.Field(default=None, max_length=253, pattern=telemetry.NODE_PATTERN)
    gpu: int | None = pydantic.Field(default=None, ge=0, le=255, description="local GPU index of the rank")
    ts: float = pydantic.Field(gt=0, description="unix seconds at the end of the step")
