"""Test doubles that ship with the package, so users' own tests (and ours) can drive healer without
schedulers or GPUs. Each says plainly what it stands in for.
"""

from __future__ import annotations

import asyncio

from healer.actuators import base


class RecordingActuator:
    """Stands in for a scheduler actuator (Slurm, Kubernetes): records every request and answers
    ``done`` (``planned`` for a dry run) unless told to fail a kind."""

    name = "recording"

    def __init__(self, fail: dict[str, base.Status] | None = None, delay_s: float = 0.0) -> None:
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
