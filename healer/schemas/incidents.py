"""The incident feed: CloudEvents 1.0 in the JSON event format (``schemas.cloudevent`` is the envelope).

``type`` is ``io.healer.incident.<opened|updated|action|resolved|escalated>.v1`` (the version lives in
the type, as CloudEvents recommends); ``data.schema`` repeats it for consumers that only keep the data.
``id`` is unique and doubles as the ``Nats-Msg-Id``, so receivers can deduplicate. The envelope accepts
and keeps extension attributes and ``dataschema``; ``data`` itself is strict (a new field is a new version).

``healer.incident.v2`` is v1 plus ``domain`` (#27): a shared-cause domain incident's failure domain, its
suspected component and its members, structured. Only domain incidents carry it; every other incident is
v1, byte for byte what it was (``codec.encode`` leaves ``domain`` out while it is null), and a domain
incident keeps its flat ``evidence`` (``domain``, ``members`` as a comma string ...) as before. The
``type`` stays ``...v1``: the envelope and the changes mean what they meant. A decoder of this version
takes v1 and v2.
"""

from __future__ import annotations

import dataclasses
import enum
from datetime import UTC, datetime
from typing import Annotated, Final, Literal

import pydantic

from healer.schemas import base, cloudevent, telemetry

SCHEMA: Final = "healer.incident.v1"
SCHEMA_V2: Final = "healer.incident.v2"
"""v1 plus ``domain``: what a shared-cause domain incident is sent as."""
DOMAIN_MEMBERS_MAX: Final = 4096
"""Members listed in ``Domain.members`` at most (``member_count`` is the true count)."""
PORT_LABEL: Final = "port"
"""The label of a port incident (``labels.port``: ``mlx5_0/1``, ``<device>/<port>`` as in sysfs): a
port-scope rule's incident is about one RDMA port of its node. A label, not a field of ``data``, so
``v1`` stays complete; the subject names the port too (``subject_of``)."""
TYPE_PREFIX = "io.healer.incident."


class Change(enum.StrEnum):
    """What an incident event says happened, declared once: the CloudEvents ``type`` carries the word
    (``io.healer.incident.<change>.v1``)."""

    OPENED = "opened"
    UPDATED = "updated"
    ACTION = "action"
    """An action's status changed."""
    RESOLVED = "resolved"
    ESCALATED = "escalated"


Severity = Literal["info", "warning", "major", "critical"]


@dataclasses.dataclass(frozen=True)
class SeverityLevel:
    """What a healer severity is, and what it becomes in the systems incidents are sent on to."""

    rank: int
    """Order, least severe first (``--severity S`` keeps S and worse)."""
    alertmanager: Literal["info", "warning", "critical"]
    """The ``severity`` label of the Alertmanager alert (the common info / warning / critical convention)."""
    pagerduty: Literal["info", "warning", "error", "critical"]
    """The PagerDuty Events API v2 ``payload.severity``."""
    meaning: str


SEVERITY_LEVELS: Final[dict[Severity, SeverityLevel]] = {
    "info": SeverityLevel(0, "info", "info", "worth knowing; nothing to do"),
    "warning": SeverityLevel(1, "warning", "warning", "degraded or at risk; look during working hours"),
    "major": SeverityLevel(
        2, "critical", "error", "capacity lost (a GPU or node out of service); act soon, page if you page"
    ),
    "critical": SeverityLevel(3, "critical", "critical", "data or jobs at risk now; page"),
}
"""The one catalogue of severities. Alertmanager's convention has three levels, so ``major`` and
``critical`` both become ``critical`` there (the original stays in the ``healer_severity`` label);
PagerDuty's four levels keep them apart."""


class Mode(enum.StrEnum):
    """How far the controller goes with what the rules ask for, declared once (settings ``mode``,
    ``data.mode`` on the wire: the same strings). Code asks a mode's properties, never its name."""

    ENFORCE = "enforce"
    """Actions are carried out."""
    DRY_RUN = "dry-run"
    """Actions are planned and recorded (status ``planned``), nothing is done."""
    OBSERVE = "observe"
    """Incidents only: no action is planned."""

    @property
    def plans(self) -> bool:
        """The incident's actions are planned (for real or as a dry run's plan)."""
        return self is not Mode.OBSERVE

    @property
    def acts(self) -> bool:
        """What is planned is carried out."""
        return self is Mode.ENFORCE

    @property
    def dry_run(self) -> bool:
        """Actions are planned but not carried out."""
        return self.plans and not self.acts


class IncidentState(enum.StrEnum):
    """Where an incident stands, declared once (``data.state`` on the wire: the same strings)."""

    OPEN = "open"
    RESOLVED = "resolved"
    """Closed: nothing more happens to it."""
    ESCALATED = "escalated"
    """Not closed, handed to people: the circuit breaker is open, or the node awaits a hardware
    replacement."""


class ActionStatus(enum.StrEnum):
    """The one catalogue of action statuses and what each means, declared once: the wire carries the
    same strings (``ActionRecord.status``), an actuator returns one of ``OUTCOMES`` for an action and
    any of them for an item inside it (``actuators.base``)."""

    PLANNED = "planned"
    """A dry run's plan: nothing was done, and the next action is planned too."""
    DONE = "done"
    ALREADY_DONE = "already-done"
    REFUSED = "refused"
    """A safety gate said no (the circuit breaker, ...)."""
    FAILED_TEMPORARY = "failed-temporary"
    FAILED_PERMANENT = "failed-permanent"
    SKIPPED = "skipped"
    """Left alone on purpose (observe mode, a maintenance exclusion, nothing of healer's to undo; an item
    such as a DaemonSet pod on a node being drained). Never an actuator's outcome."""

    @property
    def ok(self) -> bool:
        """The incident's next action runs after this one (a failed or refused step stops the chain)."""
        return self in (
            ActionStatus.PLANNED,
            ActionStatus.DONE,
            ActionStatus.ALREADY_DONE,
            ActionStatus.SKIPPED,
        )

    @property
    def final(self) -> bool:
        """Never retried (all but a temporary failure)."""
        return self is not ActionStatus.FAILED_TEMPORARY

    @property
    def took_effect(self) -> bool:
        """What the action asks for is true now (done by it, or found so)."""
        return self in (ActionStatus.DONE, ActionStatus.ALREADY_DONE)

    @property
    def outcome(self) -> bool:
        """An actuator may return it for a whole action (all but skipped, which only an item may be)."""
        return self is not ActionStatus.SKIPPED


OK: Final[frozenset[ActionStatus]] = frozenset(s for s in ActionStatus if s.ok)
"""Statuses after which the next action of the incident runs."""
FAILED: Final[frozenset[ActionStatus]] = frozenset(s for s in ActionStatus if not s.ok)
"""Statuses that stop the incident's chain of actions (and escalate it)."""
FINAL: Final[frozenset[ActionStatus]] = frozenset(s for s in ActionStatus if s.final)
"""Statuses that are never retried."""
TOOK_EFFECT: Final[frozenset[ActionStatus]] = frozenset(s for s in ActionStatus if s.took_effect)
"""Statuses after which what the action asks for holds (a cordon is in place, a cap applied)."""
OUTCOMES: Final[frozenset[ActionStatus]] = frozenset(s for s in ActionStatus if s.outcome)
"""What an actuator may return for a whole action (``actuators.base.ActionOutcome.status``)."""


class ActionRecord(pydantic.BaseModel):
    model_config = base.CONFIG

    kind: str = pydantic.Field(max_length=64)
    status: Annotated[ActionStatus, base.inline(ActionStatus, "Status")]
    detail: str = pydantic.Field(default="", max_length=4096)
    at: float


class Domain(pydantic.BaseModel):
    """A shared-cause incident's failure domain (v2): which domain, what is suspected, who is in it."""

    model_config = base.CONFIG

    key: str = pydantic.Field(max_length=128, description="the domain key: rack, switch, pdu, ...")
    value: str = pydantic.Field(max_length=253, description="the domain: r07, leaf-07, ...")
    suspected: str = pydantic.Field(max_length=512, description="the suspected shared component")
    signal_rule: str = pydantic.Field(max_length=128, description="the rule its members fired")
    members: list[str] = pydantic.Field(
        default_factory=list,
        max_length=DOMAIN_MEMBERS_MAX,
        description="the member nodes, in the order they joined",
    )
    member_incidents: list[str] = pydantic.Field(
        default_factory=list, max_length=DOMAIN_MEMBERS_MAX, description="the members' incident ids"
    )
    member_count: int = pydantic.Field(ge=0, description="members (also beyond the list's limit)")
    size: int = pydantic.Field(ge=0, description="nodes in the domain")


class IncidentData(pydantic.BaseModel):
    model_config = base.CONFIG

    schema_: Literal["healer.incident.v1", "healer.incident.v2"] = pydantic.Field(
        default=SCHEMA, alias="schema"
    )
    incident_id: str = pydantic.Field(max_length=128)
    rule_id: str = pydantic.Field(max_length=128)
    severity: Severity
    node: str = pydantic.Field(max_length=253, pattern=telemetry.NODE_PATTERN)
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    state: Annotated[IncidentState, base.inline(IncidentState, "State")]
    summary: str = pydantic.Field(max_length=4096)
    evidence: dict[str, float | int | str | bool | None] = pydantic.Field(default_factory=dict)
    actions: list[ActionRecord] = pydantic.Field(default_factory=list)
    labels: dict[str, str] = pydantic.Field(default_factory=dict)
    mode: Annotated[Mode, base.inline(Mode)]
    domain: Domain | None = None
    """(v2) A shared-cause incident's domain and members; absent from every other incident."""

    @pydantic.model_validator(mode="after")
    def _domain_is_v2(self) -> IncidentData:
        if self.domain is not None and self.schema_ != SCHEMA_V2:
            raise ValueError(f"'domain' needs schema {SCHEMA_V2}")
        return self


class IncidentEvent(cloudevent.CloudEvent):
    """A CloudEvents 1.0 envelope around IncidentData."""

    source: str = pydantic.Field(min_length=1, max_length=1024, description="healer://<cluster>/controller")
    type: str = pydantic.Field(
        pattern=r"^io\.healer\.incident\.(opened|updated|action|resolved|escalated)\.v1$"
    )
    subject: str = pydantic.Field(description="node/<node>[/gpu/<index> | /port/<device>/<port>]")
    time: datetime
    data: IncidentData

    @property
    def change(self) -> Change:
        return Change(self.type.removeprefix(TYPE_PREFIX).removesuffix(".v1"))


def event_type(change: Change) -> str:
    return f"{TYPE_PREFIX}{change}.v1"


def subject_of(node: str, gpu_index: int | None, port: str | None = None) -> str:
    """``node/<node>``, ``node/<node>/gpu/<index>``, or for a port incident
    ``node/<node>/port/<device>/<port>`` (``node/gpu-a17/port/mlx5_0/1``)."""
    if port:
        return f"node/{node}/port/{port}"
    return f"node/{node}" if gpu_index is None else f"node/{node}/gpu/{gpu_index}"


def port_of(data: IncidentData) -> str | None:
    """The RDMA port a port incident is about (``labels.port``), None for a node or GPU incident."""
    return data.labels.get(PORT_LABEL) or None


def build(*, event_id: str, cluster: str, change: Change, data: IncidentData, ts: float) -> IncidentEvent:
    return IncidentEvent(
        id=event_id,
        source=f"healer://{cluster}/controller",
        type=event_type(change),
        subject=subject_of(data.node, data.gpu_index, port_of(data)),
        time=datetime.fromtimestamp(ts, tz=UTC),
        data=data,
    )


RULES_REJECTED_TYPE: Final = "io.healer.rules.rejected.v1"


class RuleProblem(pydantic.BaseModel):
    model_config = base.CONFIG

    path: str
    line: int
    col: int
    message: str


class RulesRejectedData(pydantic.BaseModel):
    model_config = base.CONFIG

    rules_dir: str
    errors: list[RuleProblem]
    kept_rules: int = pydantic.Field(description="rules still active (the previous set)")


class RulesRejectedEvent(cloudevent.CloudEvent):
    """Published when a changed rule file fails to load and the previous rules stay active."""

    type: Literal["io.healer.rules.rejected.v1"] = RULES_REJECTED_TYPE
    subject: str = "rules"
    time: datetime
    data: RulesRejectedData
