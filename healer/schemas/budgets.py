"""Demand response and power-budget status on the bus (#30): ``healer.power.shed`` and ``.status``.

Both are request/reply, answered by the leader (a standby stays silent, so the first answer is the
leader's). A ``ShedRequest`` asks a domain with a budget (``controller.power_budgets``) to hold a lower
budget, ``to_kw``, for ``for_s`` seconds, then go back to its own (the usual stepwise restore follows);
``cancel`` ends a running shed at once. ``to_kw`` is the domain's power, as the budget's ``breaker_kw``
or ``contract_kw`` is: its GPUs may draw ``to_kw x gpu_share``. The reply is a ``ShedResult``. A request
on ``healer.power.status`` (any body) is answered with a ``PowerStatus``: every budget, its live draw,
its state and any shed.
"""

from __future__ import annotations

from typing import Final, Literal, Self

import pydantic

from healer.schemas import base

SHED_SCHEMA: Final = "healer.power_shed.v1"
SHED_RESULT_SCHEMA: Final = "healer.power_shed_result.v1"
STATUS_SCHEMA: Final = "healer.power_status.v1"
SHED_MAX_S: Final = 7 * 86400.0
"""The longest shed one request may ask for (a week; a longer hold is a budget, not a shed)."""
DOMAIN_PATTERN: Final = r"^[^=\s]{1,63}=[^\s]{1,253}$"

Phase = Literal["under", "over", "capped"]


class ShedRequest(base.WireModel):
    schema_: Literal["healer.power_shed.v1"] = pydantic.Field(default=SHED_SCHEMA, alias="schema")
    domain: str = pydantic.Field(
        pattern=DOMAIN_PATTERN, description="the budget's domain: key=value (rack=r7)"
    )
    to_kw: float | None = pydantic.Field(
        default=None,
        gt=0,
        le=100000,
        description="the domain's power to hold, in kW (x gpu_share for its GPUs)",
    )
    for_s: float = pydantic.Field(default=1800.0, gt=0, le=SHED_MAX_S, description="how long, in seconds")
    cancel: bool = pydantic.Field(default=False, description="end a running shed now (no to_kw)")
    by: str = pydantic.Field(default="", max_length=128, description="who asks (a person, a utility's feed)")
    reason: str = pydantic.Field(default="", max_length=1024)

    @pydantic.model_validator(mode="after")
    def _one_of(self) -> Self:
        if self.cancel == (self.to_kw is not None):
            raise ValueError("a shed request takes exactly one of to_kw or cancel")
        return self


class DomainStatus(pydantic.BaseModel):
    """One budget now, as the leader sees it."""

    model_config = base.CONFIG

    domain: str = pydantic.Field(max_length=400)
    source: str = pydantic.Field(max_length=256, description="breaker x derating, or contract; x gpu_share")
    policy: Literal["proportional", "priority"]
    budget_w: float = pydantic.Field(description="what the GPUs may draw by the budget")
    budget_in_force_w: float = pydantic.Field(description="the budget, or a lower running shed")
    draw_w: float = pydantic.Field(description="the GPUs' summed power at the last step")
    gpus: int = pydantic.Field(ge=0, description="GPUs counted (with power readings)")
    members: int = pydantic.Field(ge=0, description="member nodes reporting")
    phase: Phase
    capped_gpus: int = pydantic.Field(ge=0, description="GPUs held under healer's limit")
    shed_to_w: float | None = None
    shed_until: float | None = None
    incident_id: str | None = pydantic.Field(default=None, max_length=128)
    cycles: int = pydantic.Field(ge=0, description="cap cycles begun (each from first cap to full release)")


class ShedResult(base.WireModel):
    schema_: Literal["healer.power_shed_result.v1"] = pydantic.Field(
        default=SHED_RESULT_SCHEMA, alias="schema"
    )
    ok: bool
    detail: str = pydantic.Field(default="", max_length=4096)
    status: DomainStatus | None = None


class PowerStatus(base.WireModel):
    schema_: Literal["healer.power_status.v1"] = pydantic.Field(default=STATUS_SCHEMA, alias="schema")
    holder: str = pydantic.Field(max_length=256, description="the leader that answered")
    ts: float
    budgets: list[DomainStatus] = pydantic.Field(default_factory=list)
