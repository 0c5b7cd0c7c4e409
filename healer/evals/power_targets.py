"""``healer bench power``'s targets, scored from what came over the bus: one simulated second of the rack
(``Second``, from its frames), the ideal and the uniform throughput loss a budget allows (``optimal_loss``,
``level_loss``), the frames and feed as they arrive (``Watch``) and the run's ``Report`` against the
targets (``summarize``, ``Report.ok``). Pure but for ``Watch``'s decoding; the run itself is
``power_bench.measure``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from healer.bus import base
from healer.controller.power import power_budget
from healer.schemas import codec, incidents

F64 = npt.NDArray[np.float64]


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
        if not msg.subject.startswith(("healer.incidents.rules", "healer.incidents.shadow")):
            self.events.append(codec.decode_incident(msg.data))
            self.at.append(self.clock())

    def last_resolved(self) -> float | None:
        """When the newest ``resolved`` feed event arrived (None: none yet)."""
        done = [
            at for e, at in zip(self.events, self.at, strict=True) if e.change is incidents.Change.RESOLVED
        ]
        return done[-1] if done else None


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
    ends = [at for e, at in zip(watch.events, watch.at, strict=True) if e.change is incidents.Change.RESOLVED]
    cycles = [at for at in ends if marks["steady"] <= at < marks["fall"]]
    episodes = sum(
        e.change is incidents.Change.OPENED and e.data.rule_id == power_budget.RULE_ID for e in watch.events
    )
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
