"""``healer.power.shed`` and ``healer.power.status`` (#30), answered by the leader.

Demand response: a ``ShedRequest`` (``schemas/budgets.py``) names a domain with a budget and the power to
hold (``to_kw``, the domain's, x ``gpu_share`` for its GPUs) for ``for_s``; the leader writes it into the
domain's state (``power_shell.PowerShell.shed``, in KV) and answers a ``ShedResult`` with the domain's
status. From the next step on the lower budget is in force: over it for the hold time, the domain is
capped as for its own budget; when the shed ends the usual stepwise restore follows. A status request
is answered with every budget's ``DomainStatus``.

A standby does not answer (the requester gets the leader's reply, or a timeout when no controller
leads). A request that does not decode is answered ``ok: false`` with why, counted in
``healer_controller_decode_errors_total{kind="power_shed"}`` and logged at a bounded rate.
"""

from __future__ import annotations

from healer import errors
from healer.bus import base as bus_base
from healer.bus import subjects
from healer.controller.core import context, power_shell, power_views
from healer.controller.observability import throttle
from healer.controller.power import power_budget
from healer.schemas import budgets, codec

PHASES: dict[power_budget.Phase, budgets.Phase] = {
    power_budget.Phase.UNDER: "under",
    power_budget.Phase.OVER: "over",
    power_budget.Phase.CAPPED: "capped",
}


def status_of(view: power_views.DomainView) -> budgets.DomainStatus:
    b, s = view.budget, view.state
    return budgets.DomainStatus(
        domain=b.domain, source=power_views.source_of(b), policy=b.policy, budget_w=round(b.gpu_budget_w, 1),
        budget_in_force_w=round(view.budget_w, 1), draw_w=round(view.draw_w, 1), gpus=view.gpus,
        members=len(view.members), phase=PHASES[view.phase], capped_gpus=len(s.capped_w),
        shed_to_w=s.shed_to_w, shed_until=s.shed_until, incident_id=view.incident_id, cycles=len(s.cycles),
    )  # fmt: skip


class PowerApi:
    def __init__(
        self,
        ctx: context.Context,
        bus: bus_base.Bus,
        subj: subjects.Subjects,
        *,
        shell: power_shell.PowerShell,
        holder: str,
    ) -> None:
        self.bus = bus
        self.subjects = subj
        self.shell = shell
        self.role = ctx.role
        self.holder = holder
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.log = ctx.log
        self._bad = throttle.Throttled(ctx.log, "controller.bad_power_request")
        self._subs: list[bus_base.Subscription] = []

    async def subscribe(self) -> None:
        self._subs = [
            await self.bus.subscribe(self.subjects.power_shed, self.on_shed),
            await self.bus.subscribe(self.subjects.power_status, self.on_status),
        ]

    async def close(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs = []

    async def on_shed(self, msg: bus_base.Msg) -> None:
        if not self.role.leader or not msg.reply:
            return
        try:
            req = codec.decode_shed(msg.data)
        except errors.DecodeError as e:
            self.metrics.decode_errors.labels(e.kind, e.reason).inc()
            self._bad.note(e.reason, subject=msg.subject, detail=e.detail)
            self._bad.flush()
            await msg.respond(codec.encode(budgets.ShedResult(ok=False, detail=f"{e.reason}: {e.detail}")))
            return
        result = await self.shed(req)
        await msg.respond(codec.encode(result))

    async def shed(self, req: budgets.ShedRequest) -> budgets.ShedResult:
        budget = self.shell.budget(req.domain)
        now = self.clock()
        to_w = (
            None
            if req.cancel or req.to_kw is None or budget is None
            else req.to_kw * 1000.0 * budget.gpu_share
        )
        try:
            view = await self.shell.shed(req.domain, to_w, now + req.for_s)
        except errors.HealerError as e:
            return budgets.ShedResult(ok=False, detail=str(e))
        self.log.warning(
            "power.shed_requested", domain=req.domain, to_kw=req.to_kw, for_s=req.for_s, cancel=req.cancel,
            by=req.by, reason=req.reason,
        )  # fmt: skip
        if req.cancel:
            detail = f"{req.domain}: shed ended; back to its budget (restored stepwise)"
        else:
            detail = (
                f"{req.domain}: holding {req.to_kw:g} kW ({to_w or 0:.0f} W for its GPUs) for {req.for_s:g} s"
            )
            if budget is not None and (to_w or 0) >= budget.gpu_budget_w:
                detail += f"; its own budget ({budget.gpu_budget_w:.0f} W) is lower and stays in force"
        return budgets.ShedResult(ok=True, detail=detail, status=status_of(view))

    async def on_status(self, msg: bus_base.Msg) -> None:
        if not self.role.leader or not msg.reply:
            return
        await msg.respond(codec.encode(self.status()))

    def status(self) -> budgets.PowerStatus:
        views = self.shell.status()
        out = []
        for b in self.shell.cs.power_budgets:
            view = views.get(b.domain)
            if view is None:  # not stepped yet (no member reported)
                view = power_views.DomainView(
                    b, (), 0, 0.0, b.gpu_budget_w, power_budget.Phase.UNDER, power_budget.DomainState(), None
                )
            out.append(status_of(view))
        return budgets.PowerStatus(holder=self.holder, ts=self.clock(), budgets=out)
