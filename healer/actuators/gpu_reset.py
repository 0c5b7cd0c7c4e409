"""Node recovery actuator: ``reset_gpu``, ``reset_port``, ``validate`` and ``reboot_node``, done by the
node's own agent.

Like the power actuator, each request becomes a fenced ``Command`` on ``healer.cmd.<node>`` (the
leader's fencing token, an expiry of ``power_command_ttl_s``, the same id on every retry so the agent
never resets twice). The agent keeps the safety rules (docs/agent.md): a reset is refused while compute
processes run on the GPU and limited to ``gpu_reset_timeout_s``; validation returns a typed report.

Outcomes, as the recovery ladder (healer.controller.remediation.ladder) reads them:

- ``reset_gpu``: ``done`` (reset), ``refused`` (work still on the GPU, or a stale token: ask later),
  ``failed-permanent`` (the reset failed: next rung), ``failed-temporary`` (no reply, or the agent
  could not check the lease);
- ``reset_port`` (the ``ports`` parameter: the incident's RDMA ports, ``mlx5_0/1``): ``done`` once every
  port was bounced and read ACTIVE again at its expected rate, ``failed-permanent`` when one did not come
  back, the bounce failed or the agent does not know the port (next rung: the reboot), ``refused``
  while work still runs; the reply is awaited ``port_reset_timeout_s`` plus ``power_reply_timeout_s``;
- ``reboot_node`` (for Kubernetes, after healer's cordon and eviction; Slurm reboots through
  ``scontrol reboot``): ``done`` once the agent has started the reboot, ``refused`` where the agent has
  no ``agent.reboot_command`` or work still runs; no reply may mean the host went down first: the retry
  (same id) is answered from the agent's saved state after the boot;
- ``validate``: ``done`` when every check passed, ``failed-permanent`` with one item per failed check
  otherwise (with ``ports``, each of them must be ACTIVE and LinkUp at its expected rate); the reply is
  awaited ``validate_timeout_s`` plus ``power_reply_timeout_s``.

A reset's success is not confirmed from telemetry here: the ladder's next step, ``validate``, is that
confirmation (GPUs present, DBE 0, no pending remap, a quiet soak).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

import structlog

import healer
from healer import actions, config, errors
from healer.actuators import base
from healer.bus import base as bus_base
from healer.bus import subjects
from healer.schemas import codec, commands, incidents

log = structlog.get_logger(__name__)


class GpuRecoveryActuator:
    name = "gpu"

    def __init__(
        self,
        bus: bus_base.Bus,
        subjects: subjects.Subjects | None = None,
        settings: config.ActuatorSettings | None = None,
        *,
        issuer: str = "controller",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.subjects = subjects or healer.bus.subjects.Subjects()  # the parameter shadows the module
        self.settings = settings or config.ActuatorSettings()
        self.issuer = issuer
        self._clock = clock

    async def apply(self, request: base.ActionRequest) -> base.ActionOutcome:
        try:
            command = self.command(request)
        except (ValueError, errors.HealerError) as e:
            return base.ActionOutcome(status="failed-permanent", detail=f"bad {request.kind} request: {e}")
        subject = self.subjects.command(request.node)
        plan = [f"request {subject} {codec.encode(command).decode()}"]

        async def work() -> base.ActionOutcome:
            if request.dry_run:
                what = "the node" if command.gpu_index is None else f"GPU {command.gpu_index}"
                if command.action in commands.NEEDS_PORTS:
                    what = "port " + ", ".join(command.ports)
                return base.ActionOutcome(
                    status="planned",
                    detail=f"would {request.kind} {what} on {request.node}",
                    plan=plan,
                    dry_run=True,
                )
            now = self._clock()
            fresh = command.model_copy(
                update={"issued_at": now, "expires_at": now + self.settings.power_command_ttl_s}
            )
            wait_s = (command.timeout_s or 0.0) + self.settings.power_reply_timeout_s
            reply = await self.bus.request(subject, codec.encode(fresh), timeout=wait_s)
            try:
                result = codec.decode_command_result(reply.data)
            except errors.DecodeError as e:
                raise errors.PermanentError(f"the agent's reply is not a command result: {e}") from e
            if result.node != command.node or (result.command_id and result.command_id != command.id):
                raise errors.PermanentError(
                    f"reply not believed: node {result.node!r} command {result.command_id!r} "
                    f"for {command.node!r} {command.id!r}"
                )
            return _outcome(command.action, request, result, plan)

        return await base.guarded(self.name, self.settings, request, work)

    def command(self, request: base.ActionRequest) -> commands.Command:
        now = self._clock()
        params = request.params
        agent = actions.spec(request.kind).agent_command
        if agent is None or not agent.recovery:
            raise errors.PermanentError(f"the gpu actuator does not do {request.kind}")
        action = agent.name
        needs_gpu = agent.gpu == "required"
        if needs_gpu and request.gpu_index is None:
            raise errors.PermanentError(f"{request.kind} needs a GPU (the incident's gpu_index)")
        if agent.ports == "required" and not params.get("ports"):
            raise errors.PermanentError(f"{request.kind} needs ports (the incident's port)")
        limit = agent.timeout
        timeout_s = None if limit is None else float(params.get("timeout_s") or getattr(self.settings, limit))
        suffix = f":{request.gpu_index}" if needs_gpu else ""
        return commands.Command(
            id=str(params.get("action_id") or f"{request.incident_id}:{request.kind}{suffix}")[:128],
            node=request.node,
            action=action,
            gpu_index=request.gpu_index if needs_gpu else None,
            fencing_token=request.fencing_token,
            issued_at=now,
            expires_at=now + self.settings.power_command_ttl_s,
            issuer=self.issuer,
            reason=f"{base.REASON_PREFIX} {request.incident_id} {request.summary}".strip()[:1024],
            timeout_s=timeout_s,
            soak_since=params.get("soak_since"),
            dcgm_level=int(params.get("dcgm_level") or 0),
            ports=[str(p) for p in params.get("ports") or ()] if agent.ports != "none" else [],
        )


def _outcome(
    action: str,
    request: base.ActionRequest,
    result: commands.CommandResult,
    plan: list[str],
) -> base.ActionOutcome:
    detail = f"{result.status}: {result.detail}" if result.detail else result.status
    if result.status is commands.ResultStatus.REFUSED:
        return base.ActionOutcome(status="refused", detail=f"agent refused: {result.detail}", plan=plan)
    if result.status is commands.ResultStatus.FAILED:
        status: incidents.ActionStatus = (
            incidents.ActionStatus.FAILED_TEMPORARY
            if result.detail.startswith("temporary:")
            else incidents.ActionStatus.FAILED_PERMANENT
        )
        return base.ActionOutcome(status=status, detail=f"agent: {result.detail}", plan=plan)
    return READERS.get(action, _gpu_done)(request, result, detail, plan)


READERS: Final = actions.Handlers("gpu", actions.AGENT_COMMANDS)
"""How a command's applied result reads, where it is not a plain ``done`` for the GPU (``_gpu_done``)."""


@READERS.handler("validate")
def _validated(
    request: base.ActionRequest, result: commands.CommandResult, detail: str, plan: list[str]
) -> base.ActionOutcome:
    """``validate``: one item per failed check; done only when every check passed."""
    report = result.validation
    if report is None:
        return base.ActionOutcome(status="failed-permanent", detail="the agent sent no report", plan=plan)
    items = [
        base.ItemResult(
            item=c.name if c.gpu_index is None else f"gpu {c.gpu_index} {c.name}",
            status="failed-permanent",
            detail=c.detail,
        )
        for c in report.checks
        if not c.ok
    ]
    status: incidents.ActionStatus = (
        incidents.ActionStatus.DONE if report.passed else incidents.ActionStatus.FAILED_PERMANENT
    )
    return base.ActionOutcome(
        status=status, detail=detail, items=items, plan=plan, facts=_facts(report, request.gpu_index)
    )


@READERS.handler("reset_port")
def _ports_reset(
    request: base.ActionRequest, result: commands.CommandResult, detail: str, plan: list[str]
) -> base.ActionOutcome:
    """``reset_port``: one item per port bounced and back."""
    items = [
        base.ItemResult(item=f"port {r.port}", status="done", detail=r.detail) for r in result.port_resets
    ]
    return base.ActionOutcome(status="done", detail=detail, items=items, plan=plan)


def _gpu_done(
    request: base.ActionRequest, result: commands.CommandResult, detail: str, plan: list[str]
) -> base.ActionOutcome:
    """``reset_gpu`` and ``reboot_node``: done, with the request's GPU as the item."""
    item = base.ItemResult(item=f"gpu {request.gpu_index}", status="done", detail=result.detail)
    return base.ActionOutcome(status="done", detail=detail, items=[item], plan=plan)


def _facts(report: commands.Validation, gpu_index: int | None) -> dict[str, str | None]:
    """The identity of the request's GPU (the first one when the request names none), as the agent read it."""
    device = next((d for d in report.devices if gpu_index is None or d.index == gpu_index), None)
    if device is None:
        return {}
    return {
        "index": str(device.index),
        "uuid": device.uuid,
        "serial": device.serial,
        "board_part_number": device.board_part_number,
        "vbios_version": device.vbios_version,
        "driver_version": device.driver_version,
    }
