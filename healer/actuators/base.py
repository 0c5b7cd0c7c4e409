"""The actuator contract: one request in, one outcome out, no exception ever.

The controller decides *what* to do; an actuator does it on one system (the node agent, Slurm,
Kubernetes) and says how it went. Everything that can go wrong comes back as an ``ActionOutcome``:

- ``done`` / ``already-done``: the node is now in the asked-for state (``already-done``: it was);
- ``refused``: healer's own safety rules say no (an operator's drain, a deadline already past);
- ``failed-temporary``: worth trying again later (the scheduler was away) — retried here first, with
  the timings in ``ActuatorSettings``, then reported so the controller can escalate;
- ``failed-permanent``: trying again will not help (unknown node, a job that cannot be requeued);
- ``planned``: a dry run; ``plan`` lists exactly the calls the real run would make.

``guarded`` is the one wrapper every actuator runs its work through: it checks the deadline, retries
``TemporaryError`` with tenacity, turns ``PermanentError`` and any unexpected exception into an outcome,
and logs the result with the request's context bound.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import pathlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Annotated, Any, Protocol, runtime_checkable

import pydantic
import structlog
import tenacity
import yaml

from healer import actions, config, errors
from healer.schemas import base, incidents, telemetry

log = structlog.get_logger(__name__)


def _requested(kind: str) -> str:
    if kind not in actions.REQUESTS:
        raise ValueError(f"no actuator is asked for {kind!r} (known: {', '.join(sorted(actions.REQUESTS))})")
    return kind


RequestKind = Annotated[str, pydantic.AfterValidator(_requested)]
"""What an actuator is asked to do: one of the registry's ``actions.REQUESTS`` (a scheduler's verb, else the
action's own name), checked when the request is made. ``reset_gpu``, ``reset_port`` and ``validate`` go to
the node agent (actuators/gpu_reset.py), ``reboot_node`` to the scheduler (Slurm ``scontrol reboot``;
Kubernetes through the agent): the recovery ladder's rungs."""


def _an_outcome(status: incidents.ActionStatus) -> incidents.ActionStatus:
    if status not in incidents.OUTCOMES:
        raise ValueError(f"an action's outcome is never {status.value} (only an item inside it may be)")
    return status


OutcomeStatus = Annotated[incidents.ActionStatus, pydantic.AfterValidator(_an_outcome)]
"""The subset an actuator may return for a whole action: ``incidents.OUTCOMES`` (all but skipped)."""

REASON_PREFIX = "healer:"
"""Every mark healer leaves on a node (Slurm reason, Kubernetes annotation value) starts with this."""


class RebootPhase(enum.StrEnum):
    NONE = "none"
    """No reboot of healer's is pending or finished on this node."""
    REQUESTED = "requested"
    """Slurm ``REBOOT_REQUESTED``: waiting for the node's jobs to end (ASAP drains it meanwhile)."""
    ISSUED = "issued"
    """The reboot is under way (Slurm ``REBOOT_ISSUED``; Kubernetes: the bootID has not changed yet)."""
    COMPLETE = "complete"
    """Back from the reboot and still out of service (Slurm: DOWN with ``reboot complete`` in healer's
    reason; Kubernetes: a new ``bootID``, Ready, still cordoned): ready for validation, then return."""
    TIMED_OUT = "timed_out"
    """Slurm: the node did not come back within ``ResumeTimeout`` (DOWN, "reboot timed out")."""


@dataclasses.dataclass(frozen=True, slots=True)
class RebootStatus:
    phase: RebootPhase
    reason: str = ""
    boot_time: int | None = None


class ActionRequest(pydantic.BaseModel):
    """One action the controller wants done on one node (scheduler-independent)."""

    model_config = base.CONFIG

    incident_id: str = pydantic.Field(min_length=1, max_length=128)
    kind: RequestKind
    node: str = pydantic.Field(min_length=1, max_length=253, pattern=telemetry.NODE_PATTERN)
    """The node as telemetry names it; actuators map it to the scheduler's name (``NodeNames``)."""
    gpu_index: int | None = pydantic.Field(default=None, ge=0, le=255)
    params: dict[str, Any] = pydantic.Field(default_factory=dict)
    """Action parameters from the rule (``watts`` / ``percent_of_default`` for power_limit)."""
    summary: str = pydantic.Field(default="", max_length=1024)
    fencing_token: int = pydantic.Field(default=1, ge=1)
    """The acting leader's lease revision; passed on to agents, which refuse stale ones."""
    dry_run: bool = False
    deadline: float | None = None
    """Unix seconds after which the action must not start (nor be retried)."""


class ItemResult(pydantic.BaseModel):
    """What happened to one thing inside an action: a job, a pod, a GPU."""

    model_config = base.CONFIG

    item: str
    status: incidents.ActionStatus
    """Any status (``skipped``: a DaemonSet pod on a node being drained); the action's own outcome is an
    ``OutcomeStatus``."""
    detail: str = ""


class ActionOutcome(pydantic.BaseModel):
    model_config = base.CONFIG

    status: OutcomeStatus
    detail: str = ""
    items: list[ItemResult] = pydantic.Field(default_factory=list)
    plan: list[str] = pydantic.Field(default_factory=list)
    """The calls made (or, in a dry run, the calls that would be made), in order, readable."""
    dry_run: bool = False
    facts: dict[str, str | None] = pydantic.Field(default_factory=dict)
    """Device facts read on the way (validate: serial, uuid, board part number, VBIOS and driver of the
    request's GPU): a hardware replacement's evidence."""

    @property
    def ok(self) -> bool:
        return self.status in incidents.OK  # an outcome is never skipped

    def record(self, kind: str, at: float) -> incidents.ActionRecord:
        """The entry for the incident's ``actions`` list."""
        detail = self.detail
        bad = [i for i in self.items if i.status not in incidents.OK]
        if bad:
            detail += "; " + "; ".join(f"{i.item}: {i.status}: {i.detail}" for i in bad)
        return incidents.ActionRecord(kind=kind, status=self.status, detail=detail[:4096], at=at)


class Actuator(Protocol):
    """Acts on one system. ``apply`` never raises."""

    name: str

    async def apply(self, request: ActionRequest) -> ActionOutcome: ...


# Optional capabilities of a scheduler actuator, said out loud: the controller asks ``isinstance(s,
# LabelSource)`` and so on, never ``hasattr``. Slurm has labels, jobs and reboot status; Kubernetes has
# labels, pods, reboot status and reboots through the node's agent; the log actuator has none.


@runtime_checkable
class LabelSource(Protocol):
    """A scheduler that knows its nodes' labels (Kubernetes labels, Slurm partitions and features)."""

    async def node_labels(self, nodes: Sequence[str]) -> dict[str, dict[str, str]]:
        """Labels by healer node name, for those of ``nodes`` the scheduler knows (the rest are left
        out). Raises ``HealerError`` when the scheduler cannot be asked."""
        ...


@runtime_checkable
class JobSource(Protocol):
    """A scheduler that lists its jobs (Slurm: ``squeue --json``'s jobs by id)."""

    async def jobs(self) -> dict[str, dict[str, Any]]: ...


@runtime_checkable
class PodSource(Protocol):
    """A scheduler that lists its GPU pods (Kubernetes)."""

    async def pods(self) -> list[dict[str, Any]]: ...


@runtime_checkable
class RebootReporter(Protocol):
    """A scheduler that says how a reboot it took is going (Slurm's ``reboot^``, a node's boot id)."""

    async def reboot_status(self, node: str) -> RebootStatus: ...


@runtime_checkable
class AgentRouted(Protocol):
    """A scheduler that has some actions done by the node's own agent (Kubernetes reboots a node so)."""

    agent: Actuator | None


def worst(items: list[ItemResult]) -> incidents.ActionStatus:
    """Overall status of an action made of items: the worst item wins (skipped items count as done)."""
    order: list[incidents.ActionStatus] = [
        incidents.ActionStatus.FAILED_PERMANENT,
        incidents.ActionStatus.FAILED_TEMPORARY,
        incidents.ActionStatus.REFUSED,
        incidents.ActionStatus.PLANNED,
        incidents.ActionStatus.DONE,
    ]
    for status in order:
        if any(i.status == status for i in items):
            return status
    return incidents.ActionStatus.DONE if not items else incidents.ActionStatus.ALREADY_DONE


class NodeNames:
    """Telemetry node name → scheduler node name: a mapping file first, then a template."""

    def __init__(self, template: str = "{node}", mapping: Mapping[str, str] | None = None) -> None:
        try:
            template.format(node="n", short="n")
        except (KeyError, IndexError, ValueError) as e:
            raise errors.PermanentError(f"bad node_name_template {template!r}: {e!r}") from e
        self.template = template
        self.mapping = dict(mapping or {})

    @classmethod
    def from_settings(cls, settings: config.ActuatorSettings) -> NodeNames:
        mapping: dict[str, str] = {}
        if settings.node_map_file:
            try:
                raw = yaml.safe_load(pathlib.Path(settings.node_map_file).read_text()) or {}
            except (OSError, yaml.YAMLError) as e:
                raise errors.PermanentError(f"cannot read node_map_file: {e}") from e
            if not isinstance(raw, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
            ):
                raise errors.PermanentError("node_map_file must map node names (strings) to node names")
            mapping = raw
        return cls(settings.node_name_template, mapping)

    def __call__(self, node: str) -> str:
        if node in self.mapping:
            return self.mapping[node]
        return self.template.format(node=node, short=node.split(".", 1)[0])


def _delay(settings: config.ActuatorSettings, attempt: int, exc: BaseException | None) -> float:
    """The wait after failed attempt ``attempt`` (1-based): exponential from ``retry_initial_delay_s``,
    capped at ``retry_max_delay_s``, and at least what a ``TemporaryError`` asked for (within the cap)."""
    cap = float(settings.retry_max_delay_s)
    try:
        delay = min(float(settings.retry_initial_delay_s) * 2.0 ** (attempt - 1), cap)
    except OverflowError:
        delay = cap
    if isinstance(exc, errors.TemporaryError):
        delay = max(delay, min(float(exc.delay), cap))
    return max(0.0, delay)


def retry_policy(
    settings: config.ActuatorSettings, deadline: float | None, logger: Any, attempts_made: int = 0
) -> tenacity.AsyncRetrying:
    """Retry ``TemporaryError`` only, ``retry_attempts`` times in all (``attempts_made`` of them already
    made), never past ``deadline``; then re-raise."""
    stops: list[tenacity.stop.stop_base] = [
        tenacity.stop_after_attempt(max(1, settings.retry_attempts - attempts_made))
    ]
    if deadline is not None:
        stops.append(tenacity.stop_after_delay(max(0.0, deadline - time.time())))

    def wait(state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        return _delay(settings, state.attempt_number + attempts_made, exc)

    def before_sleep(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        logger.info("actuator.retry", attempt=state.attempt_number + attempts_made, error=str(error))

    return tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception_type(errors.TemporaryError),
        stop=tenacity.stop_any(*stops),
        wait=wait,
        reraise=True,
        before_sleep=before_sleep,
    )


async def with_retries(
    settings: config.ActuatorSettings,
    deadline: float | None,
    logger: Any,
    work: Callable[[], Awaitable[ActionOutcome]],
) -> ActionOutcome:
    """``retry_policy`` around ``work``, built only when the first attempt fails temporarily: a burst's
    thousands of requests mostly succeed at once, and building the policy per request cost more CPU
    than the request's own work on the recording scheduler. Same stops, waits and log as the policy."""
    try:
        return await work()
    except errors.TemporaryError as e:
        if settings.retry_attempts <= 1 or (deadline is not None and time.time() >= deadline):
            raise
        logger.info("actuator.retry", attempt=1, error=str(e))
        await asyncio.sleep(_delay(settings, 1, e))
    return await retry_policy(settings, deadline, logger, attempts_made=1)(work)


async def guarded(
    actuator: str,
    settings: config.ActuatorSettings,
    request: ActionRequest,
    work: Callable[[], Awaitable[ActionOutcome]],
) -> ActionOutcome:
    """Run ``work`` under the contract: deadline, retries of temporary errors, no exception escapes."""
    logger = log.bind(
        actuator=actuator, incident_id=request.incident_id, node=request.node, kind=request.kind
    )
    if request.deadline is not None and time.time() > request.deadline:
        outcome = ActionOutcome(status="refused", detail="deadline passed before the action started")
        logger.warning("actuator.refused", detail=outcome.detail)
        return outcome

    try:
        outcome = await with_retries(settings, request.deadline, logger, work)
    except errors.TemporaryError as e:
        outcome = ActionOutcome(status="failed-temporary", detail=str(e), dry_run=request.dry_run)
    except errors.PermanentError as e:
        outcome = ActionOutcome(status="failed-permanent", detail=str(e), dry_run=request.dry_run)
    except Exception as e:  # the contract: nothing leaks; an unknown failure is not worth retrying blind
        logger.exception("actuator.crashed")
        outcome = ActionOutcome(
            status="failed-permanent", detail=f"unexpected {type(e).__name__}: {e}", dry_run=request.dry_run
        )
    level = "info" if outcome.ok else "warning"
    getattr(logger, level)(
        "actuator.outcome",
        status=outcome.status,
        detail=outcome.detail,
        dry_run=outcome.dry_run,
        items=len(outcome.items),
    )
    return outcome


class LogActuator:
    """Does nothing but log the request: for ``notify``, for trying rules out, for unknown systems."""

    name = "log"

    def __init__(self, settings: config.ActuatorSettings | None = None) -> None:
        self.settings = settings or config.ActuatorSettings()

    async def apply(self, request: ActionRequest) -> ActionOutcome:
        plan = [f"log {request.kind} node={request.node} incident={request.incident_id}"]

        async def work() -> ActionOutcome:
            if request.dry_run:
                return ActionOutcome(status="planned", detail="would log only", plan=plan, dry_run=True)
            log.info(
                "actuator.logged",
                incident_id=request.incident_id,
                node=request.node,
                gpu_index=request.gpu_index,
                kind=request.kind,
                params=request.params,
                summary=request.summary,
            )
            return ActionOutcome(status="done", detail="logged only", plan=plan)

        return await guarded(self.name, self.settings, request, work)


Handler = Callable[[str, ActionRequest], Awaitable[ActionOutcome]]
"""A scheduler actuator's method for one request kind: ``(scheduler node name, request) -> outcome``."""


def handlers(actuator: str) -> actions.Handlers:
    """A scheduler actuator's handler table (``@HANDLERS.handler("cordon")`` on each ``Handler`` method),
    keyed by the registry's requests."""
    return actions.Handlers(actuator, actions.REQUESTS)


async def dispatch(
    actuator: str,
    settings: config.ActuatorSettings,
    request: ActionRequest,
    node: str,
    handlers: Mapping[str, Handler],
) -> ActionOutcome:
    """Run the handler for ``request.kind`` on the scheduler's ``node`` name, under ``guarded``."""

    async def work() -> ActionOutcome:
        handler = handlers.get(request.kind)
        if handler is None:
            raise errors.PermanentError(f"the {actuator} actuator does not do {request.kind}")
        return await handler(node, request)

    return await guarded(actuator, settings, request, work)
