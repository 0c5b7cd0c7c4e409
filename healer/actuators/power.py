"""Power actuator: GPU power limits, set and restored by the node's own agent over the bus.

The controller cannot touch a GPU; the agent on its node can. So ``power_limit`` and
``restore_power_limit`` become a ``Command`` sent by request/reply on ``healer.cmd.<node>``, carrying
the leader's fencing token and an expiry (``power_command_ttl_s``). The agent answers with a
``CommandResult`` (applied / already / refused / failed per GPU) and keeps the safety rules: clamping to
the GPU's range, restoring exactly the limit it found, never undoing an operator's later change. Each
command names its incident as the limit's ``holder``: a GPU that a hot-GPU incident and a power budget
both cap keeps the tighter of their limits, and goes back to its own only when both have restored.

A reply is not proof. Success is confirmed from telemetry: a frame sampled after the reply must show
the new ``power_limit_w`` (within ``power_tolerance_w``) before ``power_confirm_timeout_s`` passes.
A missing reply, or a reading that stays unchanged, is a failure (``failed-temporary``).

The command id is the idempotency key (``<incident>:<action>:<gpu>``, or ``params["action_id"]``), the
same on every retry, so an agent that already executed it answers again without acting twice.
"""

from __future__ import annotations

import asyncio
import time
import typing
from collections.abc import Awaitable, Callable
from typing import Final, Protocol

import structlog

import healer
from healer import actions, config, errors, logs
from healer.actuators import base
from healer.bus import base as bus_base
from healer.bus import subjects
from healer.schemas import codec, commands, incidents

log = structlog.get_logger(__name__)

POWER_COMMANDS: Final = actions.View(
    lambda: (
        k.agent_command.name
        for k in actions.CATALOG.values()
        if k.actuator is actions.Actuator.POWER and k.agent_command is not None
    )
)
"""The agent's commands this actuator sends (the registry's ``agent_command`` of each kind it carries
out), read live."""


class PowerReadings(Protocol):
    """Where confirmations come from: the controller's view of the latest telemetry."""

    def latest_power_limit(self, node: str, gpu_index: int) -> tuple[float, float] | None:
        """``(frame ts, power_limit_w)`` from the newest frame of ``node``; ``None`` if it has no limit
        for that GPU."""


# A readings object may also have ``reply_rejected(reason: str) -> None``: it is told about every reply
# not believed (``identity_mismatch``: from another node; ``command_mismatch``: for another command).


_ITEM_STATUS: dict[commands.ResultStatus, incidents.ActionStatus] = {
    commands.ResultStatus.APPLIED: incidents.ActionStatus.DONE,
    commands.ResultStatus.ALREADY: incidents.ActionStatus.ALREADY_DONE,
    commands.ResultStatus.REFUSED: incidents.ActionStatus.REFUSED,
    commands.ResultStatus.FAILED: incidents.ActionStatus.FAILED_PERMANENT,
}


class PowerActuator:
    name = "power"

    def __init__(
        self,
        bus: bus_base.Bus,
        readings: PowerReadings,
        subjects: subjects.Subjects | None = None,
        settings: config.ActuatorSettings | None = None,
        *,
        issuer: str = "controller",
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.bus = bus
        self.readings = readings
        self.subjects = subjects or healer.bus.subjects.Subjects()  # the parameter shadows the module
        self.settings = settings or config.ActuatorSettings()
        self.issuer = issuer
        self._clock = clock
        self._monotonic = monotonic
        self._sleep = sleep
        self._throttle = logs.Throttle()

    async def apply(self, request: base.ActionRequest) -> base.ActionOutcome:
        try:
            command = self.command(request)
        except (ValueError, errors.HealerError) as e:
            return base.ActionOutcome(status="failed-permanent", detail=f"bad power request: {e}")
        subject = self.subjects.command(request.node)
        plan = [f"request {subject} {codec.encode(command).decode()}"]

        async def work() -> base.ActionOutcome:
            if request.dry_run:
                return base.ActionOutcome(
                    status="planned",
                    detail=f"would send {command.action} to {request.node}",
                    plan=plan,
                    dry_run=True,
                )
            # Same id on every try; a fresh expiry, so a retry after a slow bus is still accepted.
            now = self._clock()
            fresh = command.model_copy(
                update={"issued_at": now, "expires_at": now + self.settings.power_command_ttl_s}
            )
            result = await self._send(subject, fresh)
            return await self._confirm(request, result, plan)

        return await base.guarded(self.name, self.settings, request, work)

    def command(self, request: base.ActionRequest) -> commands.Command:
        """The command for a request (raises ValueError on bad parameters)."""
        agent = actions.spec(request.kind).agent_command
        action = None if agent is None else agent.name
        if action is None or action not in POWER_COMMANDS:
            raise errors.PermanentError(f"the power actuator does not do {request.kind}")
        params = request.params
        gpu = "all" if request.gpu_index is None else str(request.gpu_index)
        now = self._clock()
        return commands.Command(
            id=str(params.get("action_id") or f"{request.incident_id}:{request.kind}:{gpu}")[:128],
            node=request.node,
            action=action,
            gpu_index=request.gpu_index,
            watts=params.get("watts") if action in commands.SETS_LIMIT else None,
            percent_of_default=params.get("percent_of_default") if action in commands.SETS_LIMIT else None,
            fencing_token=request.fencing_token,
            issued_at=now,
            expires_at=now + self.settings.power_command_ttl_s,
            issuer=self.issuer,
            reason=f"{base.REASON_PREFIX} {request.incident_id} {request.summary}".strip()[:1024],
            holder=request.incident_id[:128],
        )

    async def _send(self, subject: str, command: commands.Command) -> commands.CommandResult:
        reply = await self.bus.request(
            subject, codec.encode(command), timeout=self.settings.power_reply_timeout_s
        )
        try:
            result = codec.decode_command_result(reply.data)
        except errors.DecodeError as e:
            raise errors.PermanentError(f"the agent's reply is not a command result: {e}") from e
        if result.node != command.node:
            self._reject(
                "identity_mismatch", command, f"reply from node {result.node!r}, not {command.node!r}"
            )
        # An agent that cannot decode a command answers a bare refusal without its id; nothing else
        # may come back without the command's id.
        bare_refusal = (
            not result.command_id and result.status is commands.ResultStatus.REFUSED and not result.gpus
        )
        if result.command_id != command.id and not bare_refusal:
            self._reject(
                "command_mismatch", command, f"reply for command {result.command_id!r}, not {command.id!r}"
            )
        return result

    def _reject(self, reason: str, command: commands.Command, detail: str) -> typing.NoReturn:
        """A reply that does not answer this command from this node is not believed (counted, logged at
        a bounded rate) and the action fails permanently."""
        hook = getattr(self.readings, "reply_rejected", None)
        if hook is not None:
            hook(reason)
        if self._throttle.allow(reason):
            log.warning(
                "power.reply_rejected", reason=reason, node=command.node, command_id=command.id,
                detail=detail, suppressed=self._throttle.take_suppressed(reason),
            )  # fmt: skip
        raise errors.PermanentError(f"reply not believed ({reason}): {detail}")

    async def _confirm(
        self, request: base.ActionRequest, result: commands.CommandResult, plan: list[str]
    ) -> base.ActionOutcome:
        if result.status is commands.ResultStatus.REFUSED and not result.gpus:
            return base.ActionOutcome(status="refused", detail=f"agent refused: {result.detail}", plan=plan)
        if (
            result.status is commands.ResultStatus.FAILED
            and not result.gpus
            and result.detail.startswith("temporary:")
        ):
            # e.g. the agent could not read the lease to check a new fencing token: try again later
            return base.ActionOutcome(status="failed-temporary", detail=f"agent: {result.detail}", plan=plan)
        items = [
            base.ItemResult(item=f"gpu {c.index}", status=_ITEM_STATUS[c.status], detail=_describe(c))
            for c in result.gpus
        ]
        waiting = {
            c.index: c
            for c in result.gpus
            if c.status is commands.ResultStatus.APPLIED and c.applied_w is not None
        }
        deadline = self._monotonic() + self.settings.power_confirm_timeout_s
        seen: dict[int, float | None] = dict.fromkeys(waiting)
        while waiting:
            for index, change in list(waiting.items()):
                reading = self.readings.latest_power_limit(request.node, index)
                if reading is None or reading[0] < result.ts:
                    continue  # no frame sampled after the change yet
                seen[index] = reading[1]
                assert change.applied_w is not None
                if abs(reading[1] - change.applied_w) <= self.settings.power_tolerance_w:
                    del waiting[index]
            if not waiting or self._monotonic() >= deadline:
                break
            await self._sleep(self.settings.power_confirm_poll_s)
        for index, change in waiting.items():
            now_w = seen.get(index)
            still = "no frame since the change" if now_w is None else f"telemetry still shows {now_w:g} W"
            items = [
                base.ItemResult(
                    item=i.item,
                    status="failed-temporary",
                    detail=f"not confirmed: agent set {change.applied_w:g} W but {still}",
                )
                if i.item == f"gpu {index}"
                else i
                for i in items
            ]
        status = base.worst(items) if items else "failed-permanent"
        detail = f"{result.status}: {result.detail}" if result.detail else result.status
        return base.ActionOutcome(status=status, detail=detail, items=items, plan=plan)


def _describe(change: commands.PowerChange) -> str:
    parts = []
    if change.applied_w is not None:
        parts.append(f"{change.previous_w or 0:g} W -> {change.applied_w:g} W")
    if change.clamped:
        parts.append(f"clamped from {change.requested_w or 0:g} W")
    if change.detail:
        parts.append(change.detail)
    return "; ".join(parts)
