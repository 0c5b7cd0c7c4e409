"""Test doubles that ship with the package, so users' own tests (and ours) can drive healer without
schedulers or GPUs. Each says plainly what it stands in for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from healer import actions
from healer.actuators import base
from healer.schemas import incidents


class RecordingActuator:
    """Stands in for a scheduler actuator (Slurm, Kubernetes): records every request and answers
    ``done`` (``planned`` for a dry run) unless told to fail a kind."""

    name = "recording"

    def __init__(self, fail: dict[str, incidents.ActionStatus] | None = None, delay_s: float = 0.0) -> None:
        self.requests: list[base.ActionRequest] = []
        self.fail = dict(fail or {})
        self.delay_s = delay_s

    async def apply(self, request: base.ActionRequest) -> base.ActionOutcome:
        self.requests.append(request)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if request.dry_run:
            return base.ActionOutcome(
                status="planned", dry_run=True, plan=[f"{request.kind} {request.node}"], detail="dry run"
            )
        status = self.fail.get(request.kind, "done")
        return base.ActionOutcome(status=status, detail=f"{request.kind} {request.node}: {status}")

    def executed(self, kind: str | None = None) -> list[base.ActionRequest]:
        return [r for r in self.requests if not r.dry_run and (kind is None or r.kind == kind)]

    async def reboot_status(self, node: str) -> base.RebootStatus:
        """A reboot this actuator was asked for completes at once (``reboot_phase`` says otherwise)."""
        if not any(r.node == node and actions.spec(r.kind).reboots for r in self.executed()):
            return base.RebootStatus(base.RebootPhase.NONE)
        return base.RebootStatus(self.reboot_phase, "healer: reboot complete")

    reboot_phase = base.RebootPhase.COMPLETE


class RecordingGpuActuator:
    """Stands in for the node recovery actuator (``reset_gpu``, ``reset_port``, ``validate`` through the
    node agent): records every request and answers from ``script`` (per kind, the statuses of successive
    calls; ``done`` once it runs out). ``on_done`` is called with each request that succeeded (a test's fleet
    clears the fault a reset fixed). A validation reports the device facts in ``device``."""

    name = "gpu"

    def __init__(
        self,
        script: dict[str, list[incidents.ActionStatus]] | None = None,
        on_done: Callable[[base.ActionRequest], None] | None = None,
    ) -> None:
        self.requests: list[base.ActionRequest] = []
        self.script = {k: list(v) for k, v in (script or {}).items()}
        self.on_done = on_done
        self.device: dict[str, str | None] = {"serial": "1650923000001", "board_part_number": "692-2G520"}

    async def apply(self, request: base.ActionRequest) -> base.ActionOutcome:
        self.requests.append(request)
        if request.dry_run:
            return base.ActionOutcome(status="planned", dry_run=True, detail="dry run")
        queue = self.script.get(request.kind) or []
        status: incidents.ActionStatus = queue.pop(0) if queue else incidents.ActionStatus.DONE
        if status == incidents.ActionStatus.DONE and self.on_done is not None:
            self.on_done(request)
        facts = dict(self.device) if actions.spec(request.kind).reads_identity else {}
        return base.ActionOutcome(
            status=status, detail=f"{request.kind} {request.node}: {status}", facts=facts
        )

    def executed(self, kind: str | None = None) -> list[base.ActionRequest]:
        return [r for r in self.requests if not r.dry_run and (kind is None or r.kind == kind)]
