"""``healer bench power``: the power-budget targets (#30, item 5) measured through the wired controller.

Unlike ``power_eval`` (a closed loop of the pure decision on a small model), this runs the real thing:
a nats-server of its own (the venv's ``nats-server``, loopback, a temporary store), healer's simulated
fleet publishing frames and answering power commands through the agents' own command executor
(``sim_fleet.LiveFleet``), and a real ``Controller`` (enforce mode) with one rack budget, whose limit
changes go through the action path (gates, fencing, the real power actuator, confirmation from
telemetry). The rack's jobs start one node after another over ``ramp_s`` and take it over its budget,
hold at full load for ``steady_s``, then end one node after another over ``fall_s`` and the rack is
left to restore. Under ``--policy priority`` the jobs of the even nodes run in QOS ``high``, the odd
ones' in ``low`` (``controller.power_priority: {qos: {high: 1, low: 0}}``), as the simulator's
scheduler lists them (``SimScheduler``, in ``squeue --json``'s form, under the job ids the frames
carry); the controller reads them as it reads Slurm's, at the shipped ``jobs_refresh_s`` and
``jobs_unlisted_refresh_s``.

**Time-scaled.** The fleet steps one simulated second every ``1 / speed`` seconds of wall time, and the
controller, the power actuator and the agents' executor all read the simulated clock (the frames' ``ts``),
so every timer of the budget (``hold_s``, ``restore_after_s``, cooldowns, command expiry) runs in
simulated seconds. The settings that are wall-clock periods are divided by ``speed`` so they keep their
default length in simulated time (``tick_s`` 1 s, ``power_confirm_poll_s`` 0.5 s, ``reload_check_s``
2 s, ``jobs_refresh_s`` 60 s, ``jobs_unlisted_refresh_s`` 10 s). What the controller
spends in wall time (decoding, KV writes, the agents' request/reply) counts ``speed`` times over in
simulated time, so a scaled run can only look slower than a real one, never faster.

What is measured, all in simulated seconds, from what came over the bus (the frames every node
published, the incident feed):

- ``under_after_hold_s``: from the first frame in which the rack draws over its budget, plus the hold
  time, to its first frame under the budget again (target: ≤ 10);
- ``over_2pct_beyond_hold_s``: the longest run of frames more than 2 % over, less the hold time
  (target: 0);
- ``loss_ratio``: the throughput the jobs lost while capped at steady load, over the least any division
  of the same power could lose (the ideal water-filling: each GPU's marginal throughput per watt equal).
  A GPU's throughput is its SM clock from its frame over its datasheet maximum (the simulator's jobs run
  at their clock); its demand (what it would draw uncapped) is read from the simulator, which the
  controller never sees. ``loss_ratio_level`` is the same against one uniform power level (as
  ``power_eval`` reports it; target for both: ≤ 1.2);
- ``cycles_per_10min``: cap episodes that ended (``resolved`` on the feed) during steady load, and
  ``reversals_per_10min``: the rack's limits raised then lowered again (from the frames' power limits),
  per 10 minutes (target: ≤ 1). Steady load is counted from ``SETTLE_S`` after the ramp ends until the
  first job ends;
- ``restored_after_s``: from the last job's end to the incident's ``resolved`` on the feed;
  ``scheduler_requests``: drains or cordons the controller asked for (no job is stopped: 0);
- ``capped_low_gpus`` / ``capped_high_gpus``: the most GPUs of the low- and high-QOS jobs held under a
  cap at once at steady load (from the frames' limits), and ``job_listings``: how often the controller
  listed the jobs.

Figures are from healer's own simulator (its power/clock physics is a hypothesis), not real GPUs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import pathlib
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import structlog

from healer import config, testing
from healer.actuators import power
from healer.agent import sim_fleet
from healer.bus import base, embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.controller.core import service
from healer.controller.power import power_budget
from healer.schemas import codec, incidents
from healer.sim import scenarios, simulation, workloads

F64 = npt.NDArray[np.float64]
SETTLE_S = 120.0
"""Steady load is counted from this long after the ramp ends (the first cap's steps are done by then)."""
SHIPPED: Final = config.ControllerSettings.model_fields
RELOAD_CHECK_S: Final = float(SHIPPED["reload_check_s"].default)
JOBS_REFRESH_S: Final = float(SHIPPED["jobs_refresh_s"].default)
JOBS_UNLISTED_REFRESH_S: Final = float(SHIPPED["jobs_unlisted_refresh_s"].default)
"""Housekeeping's round and the job listings' periods as shipped, in simulated seconds (divided by the
speed in wall time, as ``tick_s``): a job's QOS is known to the controller as late as it would be."""

RULES = """
rules:
  - id: ecc-dbe
    description: new double-bit ECC error (the bench's rule pack; power budgets need no rule)
    scope: gpu
    when: increase(ecc_dbe_volatile[10m]) > 0
    severity: critical
    actions: [cordon]
"""


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    nodes: int
    gpus: int
    speed: float
    budget_w: float
    peak_w: float
    hold_s: float
    simulated_s: float
    wall_s: float
    cpu_s: float
    """CPU seconds of the bench's own process (controller, fleet and their clients; not nats-server)."""
    under_after_hold_s: float | None
    over_2pct_beyond_hold_s: float
    loss_ratio: float | None
    loss_ratio_level: float | None
    cycles_per_10min: float
    reversals_per_10min: float
    steady_s: float
    capped_steady_s: float
    episodes: int
    restored_after_s: float | None
    scheduler_requests: int
    frames: int
    feed_events: int
    max_over_percent: float
    capped_high_gpus: int = 0
    """The most GPUs of the high-QOS jobs held under a cap at once at steady load (``priority``: the
    low-QOS jobs shed first, so 0 unless theirs cannot shed enough)."""
    capped_low_gpus: int = 0
    job_listings: int = 0
    """How often the controller listed the scheduler's jobs (``SimScheduler.jobs``)."""

    def ok(self) -> bool:
        return (
            self.under_after_hold_s is not None
            and self.under_after_hold_s <= 10
            and self.over_2pct_beyond_hold_s <= 0
            and self.loss_ratio is not None
            and self.loss_ratio <= 1.2
            and self.cycles_per_10min <= 1
            and self.reversals_per_10min <= 1
            and self.restored_after_s is not None
            and self.scheduler_requests == 0
        )


QOS: Final = ("high", "low")
"""The Slurm QOS of the jobs on the rack's even and odd nodes, which the ``priority`` policy ranks
(``controller.power_priority``: ``{qos: {high: 1, low: 0}}``)."""


class SimScheduler(testing.RecordingActuator):
    """The simulator's scheduler, standing in for Slurm: it lists the simulated fleet's running jobs as
    ``squeue --json`` does (``job_id``, ``job_state``, ``nodes``, ``qos``, ``partition``), under the ids
    the frames carry (``<run id>-j<number>``), each with its node's QOS (``QOS``). The controller reads
    it through the same code as the real ``SlurmActuator.jobs()``, every ``jobs_refresh_s``; and, like
    the recording actuator, it records any drain or cordon asked for."""

    def __init__(self, sim: simulation.Simulation) -> None:
        super().__init__()
        self.sim = sim
        self.listings = 0

    async def jobs(self) -> dict[str, dict[str, Any]]:
        self.listings += 1
        fl = self.sim.fleet
        out: dict[str, dict[str, Any]] = {}
        for n, name in enumerate(fl.node_names):
            no = int(fl.work.job_no[n])
            if no < 0:
                continue
            job_id = self.sim.encoder.job_id(no)
            job = out.setdefault(job_id, {
                "job_id": job_id, "job_state": ["RUNNING"], "nodes": name, "qos": QOS[n % 2],
                "partition": "gpu",
            })  # fmt: skip
            if job["nodes"] != name:
                job["nodes"] += f",{name}"
        return out


def optimal_loss(demand: F64, available: float) -> float:
    """The least throughput loss (in GPUs' worth) when GPUs whose dynamic power demand is ``demand`` get
    ``available`` dynamic watts between them, throughput going with the cube root of the share of the
    demand a GPU is allowed (the simulator's DVFS rule): the allocation where each GPU's marginal
    throughput per watt is equal (x_i ∝ d_i^-1/2, at most d_i), found by bisection."""
    d = demand[demand > 1e-6]
    if d.size == 0 or available >= d.sum():
        return 0.0
    if available <= 0:
        return float(d.size)
    lo, hi = 0.0, float(d.max() * np.sqrt(d.max())) + 1.0  # x_i = min(d_i, c / sqrt(d_i))
    for _ in range(80):
        c = (lo + hi) / 2
        if np.minimum(d, c / np.sqrt(d)).sum() > available:
            hi = c
        else:
            lo = c
    x = np.minimum(d, lo / np.sqrt(d))
    return float(np.sum(1.0 - np.cbrt(x / d)))


def level_loss(demand: F64, available: float) -> float:
    """The loss when every GPU is held to one power level (a uniform water-filling, ``power_eval``'s)."""
    d = demand[demand > 1e-6]
    if d.size == 0 or available >= d.sum():
        return 0.0
    lo, hi = 0.0, float(d.max())
    for _ in range(80):
        mid = (lo + hi) / 2
        if np.minimum(d, mid).sum() > available:
            hi = mid
        else:
            lo = mid
    return float(np.sum(1.0 - np.cbrt(np.minimum(d, lo) / d)))


@dataclasses.dataclass(slots=True)
class Second:
    """One simulated second of the rack, from its frames (and the simulator's demand)."""

    ts: float
    draw_w: float
    limits_w: float
    capped: int
    loss: float
    optimal: float
    level: float
    capped_high: int = 0
    """GPUs of the high-QOS jobs (the even nodes) held under a cap."""
    capped_low: int = 0


class Watch:
    """Frames and the incident feed, as they come over the bus."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.frames: dict[float, list[Any]] = {}
        self.count = 0
        self.events: list[incidents.IncidentEvent] = []
        self.at: list[float] = []
        """The simulated time each feed event arrived."""

    async def on_frame(self, msg: base.Msg) -> None:
        frame = codec.decode_frame(msg.data)
        self.frames.setdefault(round(frame.ts, 3), []).append(frame)
        self.count += 1

    async def on_incident(self, msg: base.Msg) -> None:
        if not msg.subject.startswith("healer.incidents.rules"):
            self.events.append(codec.decode_incident(msg.data))
            self.at.append(self.clock())


def second_of(frames: Sequence[Any], ts: float, idle: F64, dyn_demand: F64, sm_max: F64) -> Second:
    """The rack at ``ts``: ``idle``, ``dyn_demand`` and ``sm_max`` are (nodes, gpus) arrays by node
    index (frames' node order does not matter)."""
    draw = limits = loss = 0.0
    capped = capped_high = 0
    used: list[float] = []
    demand: list[float] = []
    for f in frames:
        n = int(f.node.rsplit("-", 1)[-1]) if f.node.rsplit("-", 1)[-1].isdigit() else 0
        for g in f.gpus:
            draw += float(g.power_w or 0.0)
            limits += float(g.power_limit_w or 0.0)
            if g.power_limit_w is not None and g.power_default_w is not None:
                held = g.power_limit_w < g.power_default_w - 0.5
                capped += held
                capped_high += held and n % 2 == 0
            d = float(dyn_demand[n, g.index])
            if d <= 1e-6:
                continue
            loss += 1.0 - min(1.0, float(g.sm_clock_mhz or 0.0) / float(sm_max[n, g.index]))
            used.append(max(0.0, float(g.power_w or 0.0) - float(idle[n, g.index])))
            demand.append(d)
    dem = np.array(demand)
    avail = float(np.minimum(np.array(used), dem).sum()) if used else 0.0
    return Second(
        ts, draw, limits, capped, loss, optimal_loss(dem, avail), level_loss(dem, avail), capped_high,
        capped - capped_high,
    )  # fmt: skip


async def measure(
    *,
    nodes: int = 8,
    gpus: int = 8,
    budget_fraction: float = 0.8,
    ramp_s: float = 120.0,
    steady_s: float = 1200.0,
    fall_s: float = 60.0,
    restore_s: float = 1500.0,
    speed: float = 20.0,
    seed: int = 1,
    policy: str = "proportional",
    hold_s: float = 10.0,
    restore_after_s: float = 120.0,
    settle_s: float = SETTLE_S,
) -> Report:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # warnings are per step
    wall0, cpu0 = time.perf_counter(), time.process_time()
    sc = scenarios.Scenario.model_validate({"name": "power-bench", "workload": {"training": 1.0}})

    def fleet_sim() -> simulation.Simulation:
        sim = scenarios.build(
            sc, nodes=nodes, gpus=gpus, seed=seed, start_ts=time.time(), run_id=scenarios.fresh_run_id(),
            names=[f"gpu-{i:03d}" for i in range(nodes)],
        )  # fmt: skip
        w = sim.fleet.work
        w.end_t[:] = np.inf  # the bench starts and ends the jobs
        w.ckpt_phase[:] = workloads.CHECKPOINT_LENGTH_S + 1.0  # no checkpoint dip within the run
        return sim

    probe = fleet_sim()  # the rack at full load, to set its budget
    for _ in range(30):
        probe.step(1.0)
    peak = float(probe.fleet.power.sum())
    budget_kw = round(budget_fraction * peak / 1000.0, 3)

    sim = fleet_sim()
    fl = sim.fleet
    work = fl.work
    job_of = work.job_no.copy()
    work.kind[:] = workloads.IDLE
    work.job_no[:] = -1
    for _ in range(10):
        sim.step(1.0)

    def clock() -> float:
        return float(fl.t)

    watch = Watch(clock)
    with tempfile.TemporaryDirectory() as tmp, embedded.EmbeddedServer(pathlib.Path(tmp) / "nats") as srv:
        rules = pathlib.Path(tmp) / "rules"
        rules.mkdir()
        (rules / "bench.yaml").write_text(RULES)
        inventory = pathlib.Path(tmp) / "nodes.yaml"
        inventory.write_text("nodes:\n" + "".join(f"  {n}: {{rack: r1}}\n" for n in fl.node_names))
        settings = config.Settings(
            nats=config.NatsSettings(url=srv.url),
            controller=config.ControllerSettings.model_validate({
                "rules_dir": str(rules), "mode": "enforce", "admission": "file",
                "inventory_file": str(inventory), "tick_s": 1.0 / speed, "energy_accounting": True,
                "reload_check_s": RELOAD_CHECK_S / speed, "jobs_refresh_s": JOBS_REFRESH_S / speed,
                "jobs_unlisted_refresh_s": JOBS_UNLISTED_REFRESH_S / speed,
                "power_priority": {"qos": {QOS[0]: 1, QOS[1]: 0}},
                "power_budgets": [{
                    "key": "rack", "value": "r1", "contract_kw": budget_kw, "policy": policy,
                    "hold_s": hold_s, "restore_after_s": restore_after_s,
                }],
            }),
            actuators=config.ActuatorSettings(power_confirm_poll_s=0.5 / speed),
        )  # fmt: skip
        bus = await natsbus.NatsBus.connect(srv.url, name="bench-power")
        await provision.ensure(bus, subjects.Subjects(), settings.nats)
        await bus.subscribe("healer.incidents.>", watch.on_incident)
        subj = subjects.Subjects()
        await bus.subscribe(subj.all_telemetry, watch.on_frame)
        fleet_bus = await natsbus.NatsBus.connect(srv.url, name="bench-power-fleet")
        fleet = sim_fleet.LiveFleet(sim, fleet_bus, subj, clock=clock)
        await fleet.start()
        scheduler = SimScheduler(sim)
        ctl_bus = await natsbus.NatsBus.connect(srv.url, name="bench-power-controller")
        ctl = await service.build(
            settings, ctl_bus, scheduler=scheduler, clock=clock,
            power=lambda c: power.PowerActuator(ctl_bus, c, c.subjects, settings.actuators, clock=clock),
        )  # fmt: skip
        await ctl.start()
        demand: dict[float, F64] = {}
        idle = fl.p_idle.copy()
        sm_max = fl.sm_max.copy()
        try:
            async with asyncio.timeout(60):
                while not ctl.leader:
                    await fleet.tick(1.0)
                    await asyncio.sleep(1.0 / speed)
            t0 = clock()
            marks = {
                "steady": t0 + ramp_s + settle_s, "fall": t0 + ramp_s + steady_s,
                "end": t0 + ramp_s + steady_s + fall_s,
            }  # fmt: skip
            started = ended = 0
            resolved_at: float | None = None
            while True:
                t = clock() - t0
                while started < nodes and t >= started * ramp_s / nodes:  # the next node's job starts
                    work.kind[started] = workloads.TRAINING
                    work.job_no[started] = job_of[started]
                    started += 1
                while ended < nodes and t >= ramp_s + steady_s + ended * fall_s / nodes:
                    work.kind[ended] = workloads.IDLE  # the job ends (its own end, not healer's doing)
                    work.job_no[ended] = -1
                    ended += 1
                await fleet.tick(1.0)
                ts = round(clock(), 3)
                util = fl.util
                demand[ts] = (fl.p_full - fl.p_idle) * np.where(util >= 1.0, util, 0.0) / 100.0
                await asyncio.sleep(1.0 / speed)
                if resolved_at is None:
                    done = [
                        at for e, at in zip(watch.events, watch.at, strict=True) if e.change == "resolved"
                    ]
                    if done and ended == nodes:
                        resolved_at = done[-1]
                if resolved_at is not None or t > ramp_s + steady_s + fall_s + restore_s:
                    break
            for _ in range(3):  # the last frames arrive
                await asyncio.sleep(1.0 / speed)
        finally:
            await ctl.stop()
            await ctl_bus.close()
            await fleet.close()
            await fleet_bus.close()
            await bus.close()
    budget_w = budget_kw * 1000.0
    seconds = [
        second_of(fs, ts, idle, demand[ts], sm_max)
        for ts, fs in sorted(watch.frames.items())
        if ts in demand and ts >= t0 and len(fs) == nodes
    ]
    return summarize(
        seconds, watch, budget_w, peak, hold_s, marks, resolved_at, nodes, gpus, speed,
        time.perf_counter() - wall0, time.process_time() - cpu0, len(scheduler.requests),
        scheduler.listings,
    )  # fmt: skip


def summarize(
    seconds: Sequence[Second],
    watch: Watch,
    budget_w: float,
    peak_w: float,
    hold_s: float,
    marks: dict[str, float],
    resolved_at: float | None,
    nodes: int,
    gpus: int,
    speed: float,
    wall_s: float,
    cpu_s: float,
    scheduler_requests: int,
    job_listings: int = 0,
) -> Report:
    first_over = under_at = None
    run = longest = 0.0
    prev_ts: float | None = None
    max_over = 0.0
    for s in seconds:
        dt = 1.0 if prev_ts is None else s.ts - prev_ts
        prev_ts = s.ts
        max_over = max(max_over, (s.draw_w / budget_w - 1.0) * 100.0)
        if s.draw_w > budget_w:
            first_over = s.ts if first_over is None else first_over
        elif first_over is not None and under_at is None and s.ts >= first_over + hold_s:
            under_at = s.ts
        run = run + dt if s.draw_w > budget_w * 1.02 else 0.0
        longest = max(longest, run)
    steady = [s for s in seconds if marks["steady"] <= s.ts < marks["fall"]]
    capped = [s for s in steady if s.capped]
    loss = sum(s.loss for s in capped)
    optimal = sum(s.optimal for s in capped)
    level = sum(s.level for s in capped)
    steady_s = max(1.0, marks["fall"] - marks["steady"])
    ends = [at for e, at in zip(watch.events, watch.at, strict=True) if e.change == "resolved"]
    cycles = [at for at in ends if marks["steady"] <= at < marks["fall"]]
    episodes = sum(e.change == "opened" and e.data.rule_id == power_budget.RULE_ID for e in watch.events)
    reversals = 0
    rose = False
    for a, b in itertools.pairwise(steady):  # a limit raised, then lowered again
        if b.limits_w > a.limits_w + 1.0:
            rose = True
        elif b.limits_w < a.limits_w - 1.0 and rose:
            reversals += 1
            rose = False
    return Report(
        nodes=nodes, gpus=nodes * gpus, speed=speed, budget_w=round(budget_w, 1), peak_w=round(peak_w, 1),
        hold_s=hold_s, simulated_s=round(seconds[-1].ts - seconds[0].ts, 1) if seconds else 0.0,
        wall_s=round(wall_s, 1), cpu_s=round(cpu_s, 1),
        under_after_hold_s=None if under_at is None or first_over is None
        else round(max(0.0, under_at - first_over - hold_s), 1),
        over_2pct_beyond_hold_s=round(max(0.0, longest - hold_s), 1),
        loss_ratio=round(loss / optimal, 3) if optimal > 1e-6 else None,
        loss_ratio_level=round(loss / level, 3) if level > 1e-6 else None,
        cycles_per_10min=round(len(cycles) / steady_s * 600.0, 2),
        reversals_per_10min=round(reversals / steady_s * 600.0, 2),
        steady_s=steady_s, capped_steady_s=float(len(capped)), episodes=episodes,
        restored_after_s=None if resolved_at is None else round(resolved_at - marks["end"], 1),
        scheduler_requests=scheduler_requests, frames=watch.count, feed_events=len(watch.events),
        max_over_percent=round(max_over, 2),
        capped_high_gpus=max((s.capped_high for s in steady), default=0),
        capped_low_gpus=max((s.capped_low for s in steady), default=0), job_listings=job_listings,
    )  # fmt: skip


def main(
    nodes: int, speed: float, steady_s: float, seed: int, as_json: bool = False, policy: str = "proportional"
) -> int:
    """Exit 0 when every target is met, 1 otherwise (the figures are printed either way)."""
    r = asyncio.run(measure(nodes=nodes, speed=speed, steady_s=steady_s, policy=policy, seed=seed))
    if as_json:
        print(
            json.dumps({"fleet": "healer's own simulator (a hypothesis)", **dataclasses.asdict(r)}, indent=2)
        )
        return 0 if r.ok() else 1
    print(
        f"fleet: healer's own simulator (a hypothesis), one rack of {r.nodes} nodes, {r.gpus} GPUs,"
        f" seed {seed}; budget {r.budget_w / 1000:.1f} kW for the GPUs ({r.budget_w / r.peak_w:.0%} of"
        f" {r.peak_w / 1000:.1f} kW at full load), {policy}, hold {r.hold_s:g} s; {r.simulated_s:g}"
        f" simulated s at {r.speed:g}x ({r.wall_s:g} s wall, {r.cpu_s:g} s CPU)"
    )
    print(f"  under budget after the hold time: {r.under_after_hold_s} s (target <= 10)")
    print(
        f"  > 2 % over beyond the hold time: {r.over_2pct_beyond_hold_s} s (target 0;"
        f" peak {r.max_over_percent} % over)"
    )
    print(
        f"  throughput lost / ideal water-filling: {r.loss_ratio} (vs one uniform level"
        f" {r.loss_ratio_level}; target <= 1.2; {r.capped_steady_s:g} capped s at steady load)"
    )
    print(
        f"  cap/restore cycles per 10 min at steady load: {r.cycles_per_10min}, limit reversals per"
        f" 10 min: {r.reversals_per_10min} (target <= 1; {r.episodes} episode(s) in the run)"
    )
    print(
        f"  restored {r.restored_after_s} s after the last job ended; drains or cordons asked:"
        f" {r.scheduler_requests}"
    )
    if policy == "priority":
        half = r.gpus // 2
        print(
            f"  GPUs held under a cap at steady load, at most: {r.capped_low_gpus} of the {half} of low-QOS"
            f" jobs, {r.capped_high_gpus} of the {half} of high-QOS jobs ({r.job_listings} job listings)"
        )
    met = "all targets met" if r.ok() else "NOT all targets met"
    print(f"  {met} ({r.frames} frames, {r.feed_events} feed events)")
    return 0 if r.ok() else 1
