"""Power budgets, carried out (#30): the shell around the pure ``power_budget.step``.

Every ``tick_s`` the leader looks at each ``controller.power_budgets`` entry: the domain's members are the
admitted nodes whose topology (``admission.topology()``, the same map the failure-domain limits and the
shared-cause incidents read, #27) has the budget's ``key`` = ``value``; their GPUs' readings come from each
member's newest frame (``ingest.newest``). ``power_budget.step`` decides; this room applies it:

- **State in KV.** ``DomainState`` lives in KV ``healer-state`` as ``power.<key>.<value>``, written when it
  changes, read by a new leader before its first step, so a failover carries on the episode (timers,
  the limits each GPU had before, a running demand-response shed).
- **One domain incident per episode.** The first cap opens a ``power-budget`` incident (node
  ``<key>.<value>``, ``data.domain`` on the feed as a shared-cause incident has, schema v2); each later
  step is an ``updated`` change; the per-GPU limits are its evidence (``gpu.<node>.<index>``). It resolves
  once every GPU is released (``restore_power_limit``) and those actions are done.
- **The existing action path.** Each per-GPU change is a ``PlannedAction`` (``power_limit`` with
  ``watts``, or ``restore_power_limit``) of that incident, with its ``node`` and ``gpu_index`` set, run
  by the ``ActionRunner`` like every other action: mode, exclusions, cooldown and rate limit per member
  node, leadership, the fencing token, the power actuator's agent command and its confirmation from
  telemetry. A power limit takes no node out of service, so the circuit breaker does not count it.
  While a step's actions are still pending no new step is taken (no pile of stale limits), but the
  readings still tell when its limits show (``power_budget.measured``: the lag the next hold allows for).
- **Ranks.** Under ``policy: priority`` each GPU is ranked by the job on it, as the job index knows it
  (the frames' job ids, the scheduler's placements and what its listing says each job is: QOS,
  partition, priority class; ``controller.power_priority``), else by its node's label.
- **Dry-run and observe.** Nothing changes on the GPUs, so the decision would ask again every hold time:
  the readings are overlaid with the limits healer last asked for (a GPU reads at most its planned
  limit), and the episode plays out as it would have.
- **Demand response.** ``shed`` (``healer.power.shed``, ``power_api``) sets a lower budget until a time,
  kept in the same KV document.

Only the leader acts; a standby keeps no state (it loads it from KV when it takes over).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Mapping, Sequence

from healer import config, errors
from healer.controller.core import context, incident_shell, ingest, power_views
from healer.controller.incidents import book, shared_cause
from healer.controller.inventory import admission, jobs, topology
from healer.controller.power import power_budget
from healer.controller.store import kv
from healer.schemas import incidents


class PowerShell:
    def __init__(
        self,
        ctx: context.Context,
        *,
        state: kv.Store,
        book: book.Book,
        ingest: ingest.Ingest,
        admission: admission.Admission,
        shell: incident_shell.IncidentShell,
    ) -> None:
        self.cs = ctx.cs
        self.store = state
        self.book = book
        self.ingest = ingest
        self.admission = admission
        self.shell = shell
        self.role = ctx.role
        self.turn = ctx.turn
        self.metrics = ctx.metrics
        self.clock = ctx.clock
        self.stop = ctx.stop
        self.log = ctx.log
        self.states: dict[str, power_budget.DomainState] | None = None
        """Each budget's state by domain (``rack=r7``) while this process leads; None: not loaded."""
        self.views: dict[str, power_views.DomainView] = {}
        self.read_at: dict[str, float] = {}
        """When this leader last read each domain: a domain read over went over after it (``step``'s
        ``since``)."""
        self.live: dict[str, dict[str, object]] = {}
        """Each domain's live view as last written to KV (``LIVE_KEY``)."""
        self.meter = ingest.energy
        self.measure_after: set[str] = set()
        """Domains whose last step lowered limits: once its actions are done, the draw and SM ctx.clock after
        it go into the incident (``draw_after_w``, ``sm_clock_after_mhz``): the cost of the cap."""
        self.lock = asyncio.Lock()
        """Held by a step and by a demand-response request (both change a domain's state)."""
        for b in ctx.cs.power_budgets:  # every budget's series from the start, at 0
            ctx.metrics.power_episodes.labels(b.domain)

    def budget(self, domain: str) -> config.PowerBudget | None:
        return next((b for b in self.cs.power_budgets if b.domain == domain), None)

    async def run(self) -> None:
        """Every ``tick_s`` until stopped (supervised: a failure is logged, counted and retried)."""
        while not self.stop.is_set():
            async with self.turn:
                await self.tick(self.clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), timeout=self.cs.tick_s)

    async def load(self) -> dict[str, power_budget.DomainState]:
        """Every budget's state, from KV the first time this process leads."""
        if self.states is None:
            states = {}
            for b in self.cs.power_budgets:
                doc = await self.store.get(power_views.kv_key(b))
                states[b.domain] = (
                    power_budget.DomainState.load(doc.value) if doc else power_budget.DomainState()
                )
            self.states = states
            self.log.info(
                "power.loaded", budgets=len(states), capped=sum(bool(s.capped_w) for s in states.values())
            )
        return self.states

    async def save(self, budget: config.PowerBudget, state: power_budget.DomainState) -> None:
        assert self.states is not None
        if self.states.get(budget.domain) != state:
            await self.store.put(
                power_views.kv_key(budget), self.document(budget, state)
            )  # the page reads it
            self.states[budget.domain] = state

    def document(self, budget: config.PowerBudget, state: power_budget.DomainState) -> dict[str, object]:
        doc: dict[str, object] = {**state.dump(), "domain": budget.domain}
        if budget.domain in self.live:
            doc[power_views.LIVE_KEY] = self.live[budget.domain]
        return doc

    async def save_live(self, budget: config.PowerBudget, now: float) -> None:
        """The domain's live view into its KV document, when it changed enough (``live_changed``)."""
        view = self.views.get(budget.domain)
        if view is None or self.states is None:
            return
        new = power_views.live_of(view, now)
        if power_views.live_changed(self.live.get(budget.domain), new):
            self.live[budget.domain] = new
            await self.store.put(power_views.kv_key(budget), self.document(budget, view.state))

    async def tick(self, now: float) -> None:
        if not self.role.leader:
            self.states = None  # a new term starts from KV: another leader may have moved on meanwhile
            self.live = {}
            self.read_at = {}
            return
        async with self.lock:
            states = await self.load()
            believed = self.admission.topology()
            for b in self.cs.power_budgets:
                try:
                    state = states.get(b.domain, power_budget.DomainState())
                    await self._step(b, state, believed, now)
                except errors.TemporaryError as e:  # KV unavailable: this domain waits for the next tick
                    self.metrics.task_failures.labels("power-budget").inc()
                    self.log.warning("power.step_failed", domain=b.domain, error=str(e))

    def incident(self, budget: config.PowerBudget) -> book.Incident | None:
        node = shared_cause.domain_node(budget.key, budget.value)
        return self.book.get((power_budget.RULE_ID, node, None, None))

    def pending(self, inc: book.Incident | None) -> bool:
        return inc is not None and (
            inc.id in self.shell.actions.tasks or any(a.status is None for a in inc.actions)
        )

    async def _step(
        self,
        budget: config.PowerBudget,
        state: power_budget.DomainState,
        believed: topology.Topology,
        now: float,
    ) -> None:
        since = self.read_at.get(budget.domain)
        self.read_at[budget.domain] = now
        members = believed.members(budget.key, budget.value)
        reporting = sorted(n for n in members if n in self.ingest.newest)
        frames = {n: power_views.gpu_dicts(self.ingest.newest[n]) for n in reporting}
        labels = {n: believed.of(n) for n in reporting}
        readings = power_budget.readings_of(
            frames, reporting, labels, budget, self.cs.power_priority, self.jobs_at(budget, frames)
        )
        if not self.cs.mode.acts:
            readings = power_views.planned(readings, state)
        inc = self.incident(budget)
        if not readings or self.pending(inc):
            state = power_budget.measured(readings, state, now)  # a step's lag: when its limits show
            await self.save(budget, state)
            self._show(budget, reporting, readings, state, inc, now)
            await self.save_live(budget, now)
            return
        clock = power_views.mean_clock(frames)
        if inc is not None and budget.domain in self.measure_after:  # the step's limits hold now: its cost
            self.measure_after.discard(budget.domain)
            after = {"draw_after_w": round(sum(r.power_w for r in readings), 1), **self.energy(budget, inc)}
            if clock is not None:
                after["sm_clock_after_mhz"] = clock
            inc.evidence = {**inc.evidence, **after}
            await self.shell.publish(inc, incidents.Change.UPDATED)
        decision = power_budget.step(readings, budget, state, now, since)
        await self.save(budget, decision.state)
        if decision.changes:
            inc = await self._record(budget, reporting, decision, inc, now, clock, readings)
        elif inc is not None and not decision.state.capped_w:
            await self._resolve(inc, decision, now)
            inc = None
        self._show(budget, reporting, readings, decision.state, inc, now, decision)
        await self.save_live(budget, now)

    def jobs_at(
        self, budget: config.PowerBudget, frames: Mapping[str, Sequence[Mapping[str, object]]]
    ) -> power_budget.JobAt:
        """For a ``priority`` budget ranking by job (``controller.power_priority``): the job on each GPU of
        the domain that the scheduler's listing describes (``JobIndex.info_at``)."""
        fs = self.ingest.learning.failslow
        if budget.policy != "priority" or not self.cs.power_priority.by_job or fs is None:
            return {}
        out: dict[power_budget.Gpu, tuple[str, jobs.JobInfo]] = {}
        for node, gpus in frames.items():
            for g in gpus:
                idx = g.get("index")
                if isinstance(idx, int) and (found := fs.jobs.info_at(node, idx)) is not None:
                    out[(node, idx)] = found
        return out

    def _show(
        self,
        budget: config.PowerBudget,
        members: Sequence[str],
        readings: Sequence[power_budget.Reading],
        state: power_budget.DomainState,
        inc: book.Incident | None,
        now: float,
        decision: power_budget.Decision | None = None,
    ) -> None:
        draw = sum(r.power_w for r in readings)
        limit = power_budget.budget_now(budget, state, now)
        phase = (
            decision.phase
            if decision is not None
            else (power_budget.Phase.CAPPED if state.capped_w else power_budget.Phase.UNDER)
        )
        self.views[budget.domain] = power_views.DomainView(
            budget, tuple(members), len(readings), draw, limit, phase, state, inc.id if inc else None
        )
        d = budget.domain
        self.metrics.power_draw.labels(d).set(draw)
        self.metrics.power_budget.labels(d).set(limit)
        self.metrics.power_capped.labels(d).set(len(state.capped_w))

    def evidence(
        self, budget: config.PowerBudget, members: Sequence[str], decision: power_budget.Decision
    ) -> dict[str, float | int | str | bool | None]:
        s = decision.state
        return {
            "domain": budget.domain, "domain_key": budget.key, "domain_value": budget.value,
            "source": power_views.source_of(budget), "policy": budget.policy,
            "budget_w": round(budget.gpu_budget_w, 1), "budget_in_force_w": round(decision.budget_w, 1),
            "draw_w": round(decision.total_w, 1), "capped_gpus": len(s.capped_w), "members": len(members),
            "shed_to_w": s.shed_to_w, "shed_until": s.shed_until, "cycles": len(s.cycles),
            "lead_s": power_budget.lead_s(budget, s),
        }  # fmt: skip

    async def _record(
        self,
        budget: config.PowerBudget,
        members: Sequence[str],
        decision: power_budget.Decision,
        inc: book.Incident | None,
        now: float,
        clock: float | None = None,
        readings: Sequence[power_budget.Reading] = (),
    ) -> book.Incident:
        """The step's changes as the domain incident's actions: opened with the first, updated after.
        Under ``policy: priority`` each changed GPU's rank and what gave it are evidence too
        (``rank.<node>.<index>``: ``0 (job 41: partition batch)``)."""
        caps = [c for c in decision.changes if not c.release and c.to_w < c.from_w]
        what = (
            f"{len(caps)} GPU limits lowered"
            if caps
            else f"{len(decision.changes)} GPU limits raised or restored"
        )
        summary = (
            f"{budget.key} {budget.value}: GPUs drew {decision.total_w / 1000:.1f} kW against a budget of "
            f"{decision.budget_w / 1000:.1f} kW; {what} ({budget.policy}); {len(decision.state.capped_w)} "
            "GPUs held under healer's limit"
        )
        change: incidents.Change = incidents.Change.UPDATED
        if inc is None:
            node = shared_cause.domain_node(budget.key, budget.value)
            cap = incidents.DOMAIN_MEMBERS_MAX
            inc = book.Incident(
                id=book.new_id(), rule_id=power_budget.RULE_ID, severity="warning", node=node,
                summary=summary,
                domain=incidents.Domain(
                    key=budget.key[:128], value=budget.value[:253],
                    suspected=f"{budget.key} {budget.value} over its power budget"[:512],
                    signal_rule=power_budget.RULE_ID, members=list(members)[:cap], member_count=len(members),
                    size=len(members),
                ),
                mode=self.cs.mode, opened_at=now, updated_at=now,
            )  # fmt: skip
            change = incidents.Change.OPENED
            self.metrics.power_episodes.labels(budget.domain).inc()
            if self.meter is not None:
                inc.evidence["energy_start_j"] = round(self.meter.joules(budget.domain), 1)
        inc.summary = summary
        gpus = {k: v for k, v in inc.evidence.items() if k.startswith(("gpu.", "rank."))}
        ranks = {(r.node, r.gpu): f"{r.rank} ({r.ranked_by})" for r in readings}
        # the action runner applies an incident's actions one after another, each confirmed from the next
        # frame: the GPUs that shed most go first, so the domain is under its budget soonest
        for c in sorted(decision.changes, key=lambda c: c.to_w - c.from_w):
            gpus[f"gpu.{c.node}.{c.gpu}"] = (
                f"restored {c.to_w:g} W" if c.release else f"{c.from_w:g} -> {c.to_w:g} W"
            )
            if budget.policy == "priority" and (c.node, c.gpu) in ranks:
                gpus[f"rank.{c.node}.{c.gpu}"] = ranks[(c.node, c.gpu)]
            params: dict[str, object] = {} if c.release else {"watts": c.to_w}
            inc.actions.append(book.PlannedAction(kind=c.kind, params=params, node=c.node, gpu_index=c.gpu))
        kept = {
            k: v
            for k, v in inc.evidence.items()
            if k in power_views.KEPT or k.startswith(power_views.KEPT_PREFIXES)
        }
        inc.evidence = {
            **kept, **self.evidence(budget, members, decision), **self.energy(budget, inc), **gpus,
            **self.cost(decision.changes, inc, now),
        }  # fmt: skip
        if clock is not None:
            inc.evidence["sm_clock_before_mhz"] = clock  # the GPUs' mean SM clock before this step
        if caps:
            self.measure_after.add(budget.domain)  # and after it, once its limits hold
        self.log.warning(
            "power.step", incident_id=inc.id, domain=budget.domain, draw_w=round(decision.total_w),
            budget_w=round(decision.budget_w), caps=len(caps), changes=len(decision.changes),
        )  # fmt: skip
        await self.shell.publish(inc, change)
        self.shell.spawn(inc)
        return inc

    async def _resolve(self, inc: book.Incident, decision: power_budget.Decision, now: float) -> None:
        inc.state = incidents.IncidentState.RESOLVED
        inc.resolved_at = now
        inc.summary = (
            f"{inc.evidence.get('domain_key')} {inc.evidence.get('domain_value')}: every GPU back at the "
            f"limit it had before healer capped it ({decision.total_w / 1000:.1f} kW against "
            f"{decision.budget_w / 1000:.1f} kW)"
        )
        inc.evidence = {
            **inc.evidence,
            **self.energy(self.budget(str(inc.evidence.get("domain"))), inc),
            **self.cost((), inc, now),
            "outcome": "restored",
            "capped_gpus": 0,
            "draw_w": round(decision.total_w, 1),
        }
        await self.shell.publish(inc, incidents.Change.RESOLVED)

    def cost(
        self, changes: Sequence[power_budget.Change], inc: book.Incident, now: float
    ) -> dict[str, float | int | str | bool | None]:
        """The jobs' step times before the first cap and under it (``job_cost``); ``capped_at`` set once."""
        fs = self.ingest.learning.failslow
        if fs is None:
            return {}
        at = inc.evidence.get("capped_at")
        capped_at = float(at) if isinstance(at, int | float) else None
        running = [j for c in changes if (j := fs.jobs.job_of(c.node, c.gpu)) is not None]
        if capped_at is not None:  # and the jobs measured at the first cap
            running += [
                k.split(".", 1)[1]
                for k in inc.evidence
                if k.startswith(("step_s_before.", "energy_start_j."))
            ]
        out = power_views.job_cost(fs.steps, running, capped_at, inc.evidence)
        if capped_at is None and any(not c.release for c in changes):
            out["capped_at"] = now
        if self.meter is not None:  # each job's energy since the first cap (``energy_kwh.<job>``)
            for job in sorted(set(running))[: power_views.JOBS_MAX]:
                joules = self.meter.job_joules(job)
                start = inc.evidence.get(f"energy_start_j.{job}")
                if joules is None:
                    continue
                if capped_at is None:
                    out[f"energy_start_j.{job}"] = round(joules, 1)
                elif isinstance(start, int | float):
                    out[f"energy_kwh.{job}"] = round((joules - float(start)) / 3.6e6, 4)
        return out

    def energy(
        self, budget: config.PowerBudget | None, inc: book.Incident
    ) -> dict[str, float | int | str | bool | None]:
        """The domain's energy since the incident opened (``energy_accounting``), in kWh."""
        start = inc.evidence.get("energy_start_j")
        if self.meter is None or budget is None or not isinstance(start, int | float):
            return {}
        return {"energy_kwh": round((self.meter.joules(budget.domain) - float(start)) / 3.6e6, 4)}

    # -- demand response ---------------------------------------------------------------------------
    async def shed(self, domain: str, to_w: float | None, until: float) -> power_views.DomainView:
        """Hold ``domain`` at ``to_w`` (what its GPUs may draw) until ``until``; ``to_w`` None ends a shed.
        PermanentError for a domain without a budget; TemporaryError when this process does not lead."""
        budget = self.budget(domain)
        if budget is None:
            known = ", ".join(b.domain for b in self.cs.power_budgets) or "none"
            raise errors.PermanentError(f"no power budget for {domain!r} (controller.power_budgets: {known})")
        if not self.role.leader:
            raise errors.TemporaryError("not the leader")
        async with self.lock:
            states = await self.load()
            old = states.get(domain, power_budget.DomainState())
            now = self.clock()
            new = (
                power_budget.shed(old, to_w, until) if to_w is not None
                else dataclasses.replace(old, shed_to_w=None, shed_until=None)
            )  # fmt: skip
            await self.save(budget, new)
            self.log.warning("power.shed", domain=domain, to_w=to_w, until=until, for_s=round(until - now))
            view = self.views.get(domain)
            limit = power_budget.budget_now(budget, new, now)
            if view is None:
                view = power_views.DomainView(budget, (), 0, 0.0, limit, power_budget.Phase.UNDER, new, None)
            view = dataclasses.replace(view, state=new, budget_w=limit)
            self.views[domain] = view
            return view

    def status(self) -> Mapping[str, power_views.DomainView]:
        return dict(self.views)
