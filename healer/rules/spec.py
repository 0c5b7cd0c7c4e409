"""The rule-file document as pydantic models: the structure the loader validates each rule against, and
the source of the JSON Schema editors use (``healer rules schema``).

Expressions, durations and actions are plain strings/mappings here; the loader checks their content
(parser.py, lexer.py, actions.py) so those errors can point inside the value.
"""

from __future__ import annotations

from typing import Annotated, Any

import pydantic

from healer import actions, durations
from healer.rules import recovery
from healer.schemas import base, events, fields, incidents

ID_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
DURATION_PATTERN = durations.PATTERN

DURATION_HELP = durations.HELP + " (or a number of seconds)"


def _duration(value: Any) -> Any:
    if value is not None:
        durations.value(value)  # a DurationError is a ValueError: pydantic reports it at the field
    return value


def _action_schema() -> dict[str, Any]:
    bare = {"enum": list(actions.RULE_KINDS), "description": "an action without parameters"}
    with_params = [
        {
            "type": "object",
            "properties": {name: kind.params.model_json_schema()},
            "required": [name],
            "additionalProperties": False,
            "description": kind.description,
        }
        for name, kind in actions.RULE_KINDS.items()
    ]
    return {"type": "array", "items": {"anyOf": [bare, *with_params]}}


DurationValue = Annotated[
    str | float | None,
    pydantic.BeforeValidator(_duration),
    pydantic.WithJsonSchema({"anyOf": [{"type": "string", "pattern": DURATION_PATTERN}, {"type": "number"}]}),
]


class _ActionListSchema:
    """``ActionList``'s JSON schema, from the registry when asked for (a kind registered after import is
    in it)."""

    def __get_pydantic_json_schema__(self, core: Any, handler: Any) -> dict[str, Any]:
        return _action_schema()


ActionList = Annotated[list[Any], _ActionListSchema()]


class _Spec(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", populate_by_name=True)


class MatchSpec(_Spec):
    """Which GPUs/nodes a rule applies to; every given selector must match (shell-style globs)."""

    model: str | None = pydantic.Field(default=None, description='GPU product name glob, e.g. "*H100*"')
    node: str | None = pydantic.Field(default=None, description='node name glob, e.g. "gpu-a-*"')
    labels: dict[str, str] = pydantic.Field(default_factory=dict, description="node label → value glob")


class ResolveSpec(_Spec):
    when: str | None = pydantic.Field(
        default=None, description="condition that resolves the firing (default: `when` is false)"
    )
    for_: DurationValue = pydantic.Field(default=None, alias="for", description=DURATION_HELP)


class RepeatSpec(_Spec):
    """Fire only on a burst: ``count`` matching events on one target within ``within``."""

    count: int = pydantic.Field(ge=2, le=10_000, description="matching events needed within the window")
    within: DurationValue = pydantic.Field(description="the sliding window, " + DURATION_HELP)
    pids: int = pydantic.Field(
        default=0, ge=0, le=1000, description="at least this many different processes (pid) among them"
    )


class EventSpec(_Spec):
    kind: events.EventKind
    xid: list[int] | None = pydantic.Field(
        default=None, description="XID codes (kind xid) or SXID codes (kind sxid); none = any"
    )
    details: dict[str, str | int | bool] = pydantic.Field(
        default_factory=dict,
        description="decoded kernel-log fields that must all be equal, e.g. {fatal: true} (SXID)",
    )
    repeat: RepeatSpec | None = pydantic.Field(
        default=None, description="count events per GPU (scope gpu) or node (scope node) over a window"
    )


class NodeWideSpec(_Spec):
    """When most of a node's GPUs fire this rule (or rules of the same ``group``) together, the controller
    makes them one node incident with per-GPU evidence instead of one incident per GPU (a GPU that fires
    alone stays a GPU incident)."""

    min_gpus: int = pydantic.Field(
        default=2, ge=2, le=256, description="at least this many of the node's GPUs (2 or more)"
    )
    fraction: float = pydantic.Field(
        default=0.5, gt=0, le=1, description="and at least this share of the node's GPUs (0.5: half)"
    )
    group: str | None = pydantic.Field(
        default=None,
        pattern=ID_PATTERN,
        max_length=128,
        description="rules with the same group count together (default: the rule's own id)",
    )
    within: DurationValue = pydantic.Field(
        default=None,
        description="a GPU that fires this long after the node's first joins its incident only once it "
        "became node-wide (default 2m); " + DURATION_HELP,
    )
    joins: list[Annotated[str, pydantic.StringConstraints(pattern=ID_PATTERN, max_length=128)]] = (
        pydantic.Field(
            default_factory=list,
            max_length=16,
            description="groups whose node-wide incident explains this rule: a firing on a node that has "
            "one joins it instead of opening beside it (a straggler behind a node-wide power brake)",
        )
    )


class RuleSpec(_Spec):
    id: str = pydantic.Field(pattern=ID_PATTERN, max_length=128, description="unique across all files")
    description: str = pydantic.Field(default="", max_length=2000, description="what and why; cite sources")
    scope: Annotated[fields.Scope, base.inline(fields.Scope, "Scope")] = pydantic.Field(
        default=fields.Scope.GPU,
        description="one firing per GPU, per node, or per RDMA port (port metrics per port, node "
        "metrics and aggregations alike for each of the node's ports; one incident per node and port)",
    )
    match: MatchSpec = pydantic.Field(default_factory=MatchSpec)
    when: str | None = pydantic.Field(default=None, description="condition over telemetry (or on_event)")
    on_event: EventSpec | None = pydantic.Field(default=None, description="fire on a node event instead")
    for_: DurationValue = pydantic.Field(default=None, alias="for", description=DURATION_HELP)
    severity: incidents.Severity
    labels: dict[str, str] = pydantic.Field(default_factory=dict)
    actions: ActionList = pydantic.Field(default_factory=list)
    resolve: ResolveSpec | None = None
    on_resolve: ActionList = pydantic.Field(default_factory=list)
    cooldown: DurationValue = pydantic.Field(
        default=None, description="after resolving, do not fire again on the same target for this long"
    )
    node_wide: NodeWideSpec | None = pydantic.Field(
        default=None,
        description="(scope gpu) most of a node's GPUs firing together are one node incident",
    )


class RuleFile(_Spec):
    """A rule file: ``rules:``, and recovery ``ladders:`` (healer.rules.recovery), either or both."""

    rules: list[RuleSpec] = pydantic.Field(default_factory=list)
    ladders: list[recovery.LadderSpec] = pydantic.Field(default_factory=list)
