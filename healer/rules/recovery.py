"""Recovery ladders as the rule pack declares them: which rules' incidents a ladder takes over, and its rungs.

A ladder is what happens after containment (drain / cordon + migrate): each rung (``reset_gpu`` or, for
a port fault, ``reset_port``, the port's link bounced; then ``reboot_node``) is tried in order, each
followed by validation; a rung that fails or whose validation
fails leads to the next one; when the rungs run out, or the GPU needed recovery ``repeat_limit.count``
times within ``repeat_limit.within``, or the ladder is NVIDIA's "contact support" class
(``contact_support: true``, no rungs), the node stays out and a ``hardware_replacement`` incident opens.

```yaml
ladders:
  - id: gpu-fatal
    rules: [xid-fatal, ecc-uncorrectable]
    steps: [reset_gpu, reboot_node]
    soak: 10m
    dcgm_level: 1
    repeat_limit: {count: 2, within: 30d}
  - id: fabric
    rules: [rdma-port-down]
    steps: [reset_port, reboot_node]     # an incident without a port (node scope) skips reset_port
```

This module only describes the declaration (``LadderSpec`` is what the loader validates, with
file:line:col errors; ``Ladder`` is the typed result). The state machine that walks a ladder is
``healer.controller.remediation.ladder``.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Final

import pydantic

from healer import actions, durations

RUNGS: Final = actions.RUNGS
"""Every rung, smallest hammer first (the order a ladder's ``steps`` must keep): the registry's kinds with
a ``rung``, by its ``order``."""


def _a_rung(name: str) -> str:
    if name not in RUNGS:
        raise ValueError(f"{name!r} is no rung (rungs: {', '.join(RUNGS)})")
    return name


Rung = Annotated[str, pydantic.AfterValidator(_a_rung), actions.EnumSchema(RUNGS)]
"""A rung's kind name (``actions.ActionKind.rung`` says its place, phase and budget)."""
ID_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
DEFAULT_SOAK_S = 600.0
"""Validation's quiet soak: no XID for this long after the rung (the issue's default, 10 minutes)."""
DEFAULT_REPEAT_COUNT = 2
DEFAULT_REPEAT_WITHIN_S = 30 * 86400.0


def _duration(value: Any) -> Any:
    if value is not None:
        durations.value(value)
    return value


Duration = Annotated[str | int | float, pydantic.AfterValidator(_duration)]


class RepeatLimitSpec(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    count: int = pydantic.Field(default=DEFAULT_REPEAT_COUNT, ge=1, le=100)
    """The Nth recovery of one GPU within ``within`` goes to replacement instead."""
    within: Duration = "30d"


class LadderSpec(pydantic.BaseModel):
    """One ladder as written in a rule file (under the top-level ``ladders:`` key)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    id: str = pydantic.Field(pattern=ID_PATTERN, max_length=128)
    description: str = ""
    rules: list[str] = pydantic.Field(min_length=1, description="ids of the rules whose incidents it takes")
    steps: list[Rung] = pydantic.Field(default_factory=list, description="rungs after containment, in order")
    contact_support: bool = pydantic.Field(
        default=False, description="NVIDIA says contact support: no rung, straight to replacement"
    )
    soak: Duration = "10m"
    dcgm_level: int = pydantic.Field(default=1, ge=0, le=4, description="dcgmi diag -r level; 0: none")
    repeat_limit: RepeatLimitSpec = pydantic.Field(default_factory=RepeatLimitSpec)

    @pydantic.model_validator(mode="after")
    def _rungs(self) -> LadderSpec:
        if len(set(self.steps)) != len(self.steps):
            raise ValueError("steps: each rung at most once")
        if self.steps and list(self.steps) != [r for r in RUNGS if r in self.steps]:
            raise ValueError(f"steps: in the order {', '.join(RUNGS)} (the smaller hammer first)")
        if self.contact_support and self.steps:
            raise ValueError("a contact_support ladder has no steps (the GPU goes to replacement)")
        if not self.contact_support and not self.steps:
            raise ValueError(f"a ladder needs steps ({', '.join(RUNGS)}) or contact_support: true")
        return self


@dataclasses.dataclass(frozen=True, slots=True)
class Ladder:
    id: str
    rules: tuple[str, ...]
    steps: tuple[Rung, ...]
    contact_support: bool = False
    soak_s: float = DEFAULT_SOAK_S
    dcgm_level: int = 1
    repeat_count: int = DEFAULT_REPEAT_COUNT
    repeat_within_s: float = DEFAULT_REPEAT_WITHIN_S
    description: str = ""
    path: str = "<string>"
    line: int = 0


def build(s: LadderSpec, path: str, line: int) -> Ladder:
    return Ladder(
        id=s.id,
        rules=tuple(s.rules),
        steps=tuple(s.steps),
        contact_support=s.contact_support,
        soak_s=durations.value(s.soak),
        dcgm_level=s.dcgm_level,
        repeat_count=s.repeat_limit.count,
        repeat_within_s=durations.value(s.repeat_limit.within),
        description=s.description,
        path=path,
        line=line,
    )
