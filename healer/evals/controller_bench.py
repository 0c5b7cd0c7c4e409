"""``healer bench controller``: how many node-frames one controller process ingests and evaluates, next
to what a bare subscriber can receive on the same machine in the same run, and fault-to-action latency.

Three measurements, each with a separate publisher process flooding (or pacing) a local nats-server:

1. **bare ceiling**: a nats-py subscriber that only receives and decodes each frame with orjson;
2. **controller**: the real Controller with the default rule pack (observe mode, so the cost measured is
   ingest + rule evaluation + incidents, not actuators), frames counted by its own metric; then the same
   as shard 0 of two (it receives every frame, ingests its half and skips the rest), which says how much
   of a core each of two shards needs for a given fleet;
3. **latency**: nodes paced at one frame per second, a new double-bit ECC error injected on a node every
   couple of seconds; latency is from the publish of the first faulty frame to the actuator receiving
   the cordon (enforce mode, recording actuator), p50/p99;
4. **XID to action**: the same paced fleet, a fatal XID 79 event published durably on a different node
   every 0.3 s; latency is from the publish to the actuator receiving the incident's first request
   (events act at arrival, not at the next tick), p50/p99.

The paced fleet sends each second's frames in one burst by default (the publisher as fast as it can, then
idle until the next second: every node in step, the worst case); with ``--spread`` it sends them evenly
over the second, as a fleet of agents does, each on the phase of its own process's clock.

Each rate is given per CPU second of the consuming process (the per-core figure the targets are stated
in, robust to other load on the machine and to a publisher that cannot outrun the bare subscriber) and
per wall second. Ratios are what to read: absolute numbers depend on the machine and on what else runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import pathlib
import statistics
import tempfile
import time
from typing import Any

import orjson
import structlog

from healer import config, errors, testing
from healer.bus import embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.controller.core import service
from healer.evals import agent_xid, frame_publisher
from healer.schemas import codec, events


@dataclasses.dataclass
class Rate:
    """Frames over a measured span, by the wall clock and by this process's CPU time (the per-core
    figure: immune to a publisher that cannot keep up and to other load on the machine)."""

    frames: float
    wall_s: float
    cpu_s: float

    @property
    def per_s(self) -> float:
        return self.frames / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def per_cpu_s(self) -> float:
        return self.frames / self.cpu_s if self.cpu_s > 0 else 0.0


async def bare_ceiling(url: str, nodes: int, seconds: float) -> Rate:
    count = 0
    first = last = (0.0, 0.0)

    def handle(data: bytes) -> None:
        nonlocal count, first, last
        orjson.loads(data)
        now = (time.perf_counter(), time.process_time())
        if not count:
            first = now
        count += 1
        last = now

    close = await natsbus.bare_subscriber(url, "healer.telemetry.*", handle)
    proc, queue = frame_publisher.start_publisher(url, nodes, seconds, 0, 0)
    await asyncio.to_thread(proc.join, seconds + 60)
    await asyncio.sleep(1.0)
    await close()
    queue.get(timeout=5)
    return Rate(count - 1, last[0] - first[0], last[1] - first[1])


FRAME_ARRIVALS_S = config.ControllerSettings().frame_arrivals_s
"""The controllers' ``frame_arrivals_s`` by default (``--frame-arrivals-s``; 0: frames only at ticks)."""


def _settings(
    url: str,
    rules_dir: str,
    mode: str,
    tick_s: float,
    shards: int = 1,
    frame_arrivals_s: float = FRAME_ARRIVALS_S,
) -> config.Settings:
    return config.Settings(
        nats=config.NatsSettings(url=url),
        controller=config.ControllerSettings.model_validate(
            {"rules_dir": rules_dir, "mode": mode, "tick_s": tick_s, "breaker_max_percent": 50.0,
             "shards": shards, "shard": 0, "admission": "first-seen", "frame_arrivals_s": frame_arrivals_s}
        ),
    )  # fmt: skip


async def controller_rate(
    url: str, rules_dir: str, nodes: int, seconds: float, shards: int = 1, arrivals: float = FRAME_ARRIVALS_S
) -> tuple[Rate, float, int]:
    """Shard 0 of ``shards`` under the flood; with shards > 1 the rate counts the fleet's frames (its own
    scaled by its share of the nodes), since a shard receives every frame and skips the others'."""
    bus = await natsbus.NatsBus.connect(url, name="bench-controller")
    ctl = await service.build(
        _settings(url, rules_dir, "observe", 1.0, shards, arrivals),
        bus,
        scheduler=testing.RecordingActuator(),
    )
    share = sum(service.shard_of(f"gpu-{i:05d}", shards) == 0 for i in range(nodes)) / nodes
    await ctl.start()
    samples: list[tuple[float, float, float]] = []

    def frames() -> float:
        return ctl.metrics.registry.get_sample_value("healer_controller_frames_ingested_total") or 0.0

    async def sample() -> None:
        while True:
            samples.append((time.perf_counter(), time.process_time(), frames()))
            await asyncio.sleep(0.25)

    sampler = asyncio.create_task(sample())
    proc, queue = frame_publisher.start_publisher(url, nodes, seconds, 0, 0)
    await asyncio.to_thread(proc.join, seconds + 60)
    await asyncio.sleep(2.0)
    sampler.cancel()
    await ctl.stop()
    await bus.close()
    queue.get(timeout=5)
    # from the first frame to the last sample that saw a new one (not the idle tail after the flood)
    moving = [s for i, s in enumerate(samples) if s[2] > 0 and (i == 0 or s[2] > samples[i - 1][2])]
    if len(moving) < 2:
        return Rate(0, 0, 0), 0.0, 0
    (t0, c0, n0), (t1, c1, n1) = moving[0], moving[-1]
    ticks = next(iter(ctl.metrics.tick.collect())).samples
    tick_sum = next(s.value for s in ticks if s.name.endswith("_sum"))
    tick_count = next(s.value for s in ticks if s.name.endswith("_count"))
    dropped = int(ctl.metrics.registry.get_sample_value("healer_controller_frames_dropped_total") or 0)
    return Rate((n1 - n0) / share, t1 - t0, c1 - c0), tick_sum / max(tick_count, 1), dropped


@dataclasses.dataclass(frozen=True)
class Cost:
    """What the paced latency controller cost while the publisher ran, per wall second: its process's
    CPU (the bench's own asyncio loop included; the publisher is another process), and of it the
    arrival evaluations of frames (``controller.frame_arrivals_s``; their frames' flush not counted).
    Both are CPU time over the same window (the arrivals' counter read at its start and end), so the
    second is part of the first also on a loaded machine."""

    core: float
    frame_arrivals: float


async def _enforcing(
    url: str, name: str, rules_dir: str, shards: int, arrivals: float
) -> tuple[natsbus.NatsBus, _TimedActuator, service.Controller]:
    """A started controller in enforce mode at 1 s ticks, shard 0 of ``shards``, on a connection of its
    own, acting through a ``_TimedActuator``."""
    bus = await natsbus.NatsBus.connect(url, name=name)
    actuator = _TimedActuator()
    ctl = await service.build(
        _settings(url, rules_dir, "enforce", 1.0, shards, arrivals), bus, scheduler=actuator
    )
    await ctl.start()
    return bus, actuator, ctl


async def latency(
    url: str,
    rules_dir: str,
    nodes: int,
    seconds: float,
    faults: int,
    shards: int = 1,
    spread: bool = False,
    arrivals: float = FRAME_ARRIVALS_S,
) -> tuple[list[float], int, Cost]:
    """Fault-to-action latencies, frames dropped and the cost, for shard 0 of ``shards`` (all of the
    fleet's frames reach it; it ingests its share)."""
    bus, actuator, ctl = await _enforcing(url, "bench-latency", rules_dir, shards, arrivals)
    value = ctl.metrics.registry.get_sample_value

    def arrivals_cpu() -> float:
        return value("healer_controller_frame_arrival_seconds_total") or 0.0

    proc, queue = frame_publisher.start_publisher(url, nodes, seconds, 1.0, faults, shards, spread)
    t0, c0, a0 = time.perf_counter(), time.process_time(), arrivals_cpu()
    await asyncio.to_thread(proc.join, seconds + 60)
    t1, c1, a1 = time.perf_counter(), time.process_time(), arrivals_cpu()
    await asyncio.sleep(3.0)
    await ctl.stop()
    await bus.close()
    injected: dict[str, float] = queue.get(timeout=5)["injected"]
    dropped = int(value("healer_controller_frames_dropped_total") or 0)
    wall = max(t1 - t0, 1e-9)
    cost = Cost((c1 - c0) / wall, (a1 - a0) / wall)
    return sorted(actuator.first[n] - t for n, t in injected.items() if n in actuator.first), dropped, cost


async def xid_latency(
    url: str,
    rules_dir: str,
    nodes: int,
    events_n: int,
    shards: int = 1,
    spread: bool = False,
    arrivals: float = FRAME_ARRIVALS_S,
) -> tuple[list[float], dict[str, int]]:
    """XID to first action: nodes paced at 1 Hz, then one XID 79 (fallen off the bus) published durably
    every 0.3 s on a different node of shard 0; latency is from the publish to the actuator receiving
    the incident's first request (the cordon). Also: the kinds of the first requests."""
    bus, actuator, ctl = await _enforcing(url, "bench-xid", rules_dir, shards, arrivals)
    seconds = 60.0 + 0.3 * events_n
    # keep the queue referenced while the publisher runs: dropped, it unlinks the semaphore the spawned
    # child is still unpickling (FileNotFoundError in the child, and no frames at all)
    proc, queue = frame_publisher.start_publisher(url, nodes, seconds, 1.0, 0, shards, spread)
    names = [f"gpu-{i:05d}" for i in range(nodes) if service.shard_of(f"gpu-{i:05d}", shards) == 0]
    victims = names[:: max(1, len(names) // max(1, events_n))][:events_n]
    # leading, and every victim admitted (first seen) before its XID: one for a node not seen yet waits
    # for the admission refresh (JetStream redelivers it), which is not what is measured here
    for _ in range(600):
        if ctl.role.took_over and set(victims) <= ctl.ingest.nodes:
            break
        await asyncio.sleep(0.1)
    else:
        proc.terminate()
        await ctl.stop()
        await bus.close()
        seen = len(set(victims) & ctl.ingest.nodes)
        raise errors.PermanentError(
            f"XID bench: {seen} of {len(victims)} nodes seen after 60 s (leader: {ctl.role.took_over}); "
            "the publisher did not run"
        )
    await asyncio.sleep(2.0)
    subj = subjects.Subjects()
    sent: dict[str, float] = {}
    for node in victims:
        event = events.new(node, "xid", gpu_index=3, xid=79, message="GPU has fallen off the bus")
        sent[node] = time.time()
        await bus.publish_durable(subj.events(node), codec.encode(event), msg_id=event.id)
        await asyncio.sleep(0.3)
    for _ in range(50):  # the last XIDs' cordons
        if set(sent) <= set(actuator.first):
            break
        await asyncio.sleep(0.1)
    proc.terminate()
    await asyncio.to_thread(proc.join, 10)
    queue.close()
    await ctl.stop()
    await bus.close()
    kinds: dict[str, int] = {}
    for node in sent:
        kind = actuator.first_kind.get(node)
        if kind is not None:
            kinds[kind] = kinds.get(kind, 0) + 1
    return sorted(actuator.first[n] - t for n, t in sent.items() if n in actuator.first), kinds


class _TimedActuator(testing.RecordingActuator):
    def __init__(self) -> None:
        super().__init__()
        self.first: dict[str, float] = {}
        self.first_kind: dict[str, str] = {}

    async def apply(self, request: Any) -> Any:
        self.first.setdefault(request.node, time.time())
        self.first_kind.setdefault(request.node, str(request.kind))
        return await super().apply(request)


def _quantiles(lat: list[float]) -> tuple[float | None, float | None]:
    """(p50, p99) in seconds, rounded to the millisecond; None without samples."""
    if not lat:
        return None, None
    q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else [lat[0]] * 99
    return round(statistics.median(lat), 3), round(q[98], 3)


@dataclasses.dataclass
class Report:
    nodes: int
    frame_bytes: int
    bare_frames_per_s: float
    bare_frames_per_cpu_s: float
    controller_frames_per_s: float
    controller_frames_per_cpu_s: float
    controller_frames_dropped: int
    ratio: float
    """controller / bare, frames per CPU second of each (per core)."""
    ratio_wall: float
    shard_of_2_fleet_frames_per_cpu_s: float
    """Shard 0 of two: the fleet's frames (its half ingested, the other half skipped) per CPU second."""
    tick_mean_s: float
    latency_nodes: int
    latency_shards: int
    """The latency controller is shard 0 of this many (it receives every frame, ingests its share)."""
    latency_frames_dropped: int
    latency_faults_detected: int
    latency_p50_s: float | None
    latency_p99_s: float | None
    xid_events: int = 0
    xid_acted: int = 0
    """XID 79 events whose node got a first request (the cordon) from the actuator."""
    xid_first_kinds: dict[str, int] = dataclasses.field(default_factory=dict)
    xid_p50_s: float | None = None
    """XID published → first action (cordon) received by the actuator, at ``latency_nodes`` nodes."""
    xid_p99_s: float | None = None
    spread: bool = False
    """The paced fleet's frames evenly over each second (agents on their own clocks), not in one burst."""
    frame_arrivals_s: float = FRAME_ARRIVALS_S
    """Every controller's ``frame_arrivals_s`` in this run (0: frames evaluated only at ticks)."""
    latency_core: float | None = None
    """The latency controller's process CPU per wall second while the fleet was paced at 1 Hz."""
    latency_frame_arrivals_core: float | None = None
    """Of it, the arrival evaluations of frames (the rules without ``for`` between ticks)."""
    agent_xid: dict[str, Any] | None = None
    """``--agent-xid N``: from real agents' NVML XID to the cordon asked, stage by stage (agent_xid.py)."""


async def run(
    nodes: int,
    seconds: float,
    latency_nodes: int,
    faults: int,
    rules_dir: str,
    rounds: int = 2,
    latency_shards: int = 1,
    xid_events: int = 20,
    spread: bool = False,
    frame_arrivals_s: float | None = None,
    agent_xid_n: int = 0,
) -> Report:
    """Every figure of the report in one run; ``frame_arrivals_s`` for every controller in it (None: the
    controller's default)."""
    arrivals = FRAME_ARRIVALS_S if frame_arrivals_s is None else frame_arrivals_s
    frame_bytes = len(frame_publisher.templates(1, set())[0][1])
    with tempfile.TemporaryDirectory() as tmp, embedded.EmbeddedServer(pathlib.Path(tmp) / "nats") as srv:
        b = await natsbus.NatsBus.connect(srv.url)
        await provision.ensure(b, subjects.Subjects(), config.NatsSettings())
        await b.close()
        # Interleaved rounds, best of each: load from other processes comes and goes, and a round it
        # slows down should not be read as the code's speed.
        bares, ctls, shard_rates = [], [], []
        for _ in range(rounds):
            bares.append(await bare_ceiling(srv.url, nodes, seconds))
            ctls.append(await controller_rate(srv.url, rules_dir, nodes, seconds, 1, arrivals))
            shard_rates.append((await controller_rate(srv.url, rules_dir, nodes, seconds, 2, arrivals))[0])
        bare = max(bares, key=lambda r: r.per_cpu_s)
        ctl_rate, tick_mean, dropped = max(ctls, key=lambda r: r[0].per_cpu_s)
        shard_rate = max(shard_rates, key=lambda r: r.per_cpu_s)
    with tempfile.TemporaryDirectory() as tmp, embedded.EmbeddedServer(pathlib.Path(tmp) / "nats") as srv:
        b = await natsbus.NatsBus.connect(srv.url)
        await provision.ensure(b, subjects.Subjects(), config.NatsSettings())
        await b.close()
        lat_s = max(seconds, 5 + 2 * faults + 5)
        lat, lat_dropped, lat_cost = await latency(
            srv.url, rules_dir, latency_nodes, lat_s, faults, latency_shards, spread, arrivals
        )
    # a server of its own: the faulty nodes above have open incidents (cordoned), which an XID would join
    with tempfile.TemporaryDirectory() as tmp, embedded.EmbeddedServer(pathlib.Path(tmp) / "nats") as srv:
        b = await natsbus.NatsBus.connect(srv.url)
        await provision.ensure(b, subjects.Subjects(), config.NatsSettings())
        await b.close()
        xid_lat, xid_kinds = await xid_latency(
            srv.url, rules_dir, latency_nodes, xid_events, latency_shards, spread, arrivals
        )
    xid_p50, xid_p99 = _quantiles(xid_lat)
    agent = dataclasses.asdict(await agent_xid.figure(agent_xid_n, rules_dir)) if agent_xid_n else None
    q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else []
    return Report(
        nodes=nodes,
        frame_bytes=frame_bytes,
        bare_frames_per_s=round(bare.per_s),
        bare_frames_per_cpu_s=round(bare.per_cpu_s),
        controller_frames_per_s=round(ctl_rate.per_s),
        controller_frames_per_cpu_s=round(ctl_rate.per_cpu_s),
        controller_frames_dropped=dropped,
        ratio=round(ctl_rate.per_cpu_s / bare.per_cpu_s, 3) if bare.per_cpu_s else 0.0,
        ratio_wall=round(ctl_rate.per_s / bare.per_s, 3) if bare.per_s else 0.0,
        shard_of_2_fleet_frames_per_cpu_s=round(shard_rate.per_cpu_s),
        tick_mean_s=round(tick_mean, 4),
        latency_nodes=latency_nodes,
        latency_shards=latency_shards,
        latency_frames_dropped=lat_dropped,
        latency_faults_detected=len(lat),
        latency_p50_s=round(statistics.median(lat), 3) if lat else None,
        latency_p99_s=round(q[98], 3) if q else (round(lat[0], 3) if lat else None),
        xid_events=xid_events,
        xid_acted=len(xid_lat),
        xid_first_kinds=xid_kinds,
        xid_p50_s=xid_p50,
        xid_p99_s=xid_p99,
        spread=spread,
        frame_arrivals_s=arrivals,
        latency_core=round(lat_cost.core, 3),
        latency_frame_arrivals_core=round(lat_cost.frame_arrivals, 4),
        agent_xid=agent,
    )


def main(
    nodes: int,
    seconds: float,
    latency_nodes: int,
    faults: int,
    rules_dir: str,
    as_json: bool,
    rounds: int = 2,
    latency_shards: int = 1,
    xid_events: int = 20,
    spread: bool = False,
    frame_arrivals_s: float | None = None,
    agent_xid_n: int = 0,
) -> int:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    report = asyncio.run(
        run(
            nodes, seconds, latency_nodes, faults, rules_dir, rounds, latency_shards, xid_events, spread,
            frame_arrivals_s, agent_xid_n,
        )
    )  # fmt: skip
    if as_json:
        print(json.dumps(dataclasses.asdict(report), indent=2))
        return 0
    print(f"controller benchmark: {nodes} distinct nodes x 8 GPUs, frames of {report.frame_bytes} bytes")
    print("                                             per CPU second   per wall second")
    print(
        f"  bare nats-py subscriber + orjson decode : {report.bare_frames_per_cpu_s:>8,.0f} frames"
        f"  {report.bare_frames_per_s:>12,.0f} frames"
    )
    print(
        f"  controller (decode, ingest, evaluate)   : {report.controller_frames_per_cpu_s:>8,.0f} frames"
        f"  {report.controller_frames_per_s:>12,.0f} frames"
    )
    print(f"  ratio controller / bare                 : {report.ratio:>8.2f}  {report.ratio_wall:>18.2f}")
    print(f"  frames the controller dropped (backlog) : {report.controller_frames_dropped:>8,}")
    shard = report.shard_of_2_fleet_frames_per_cpu_s
    print(
        f"  shard 0 of 2, the fleet's frames        : {shard:>8,.0f} frames"
        f"  (10,000 nodes at 1 Hz: {10_000 / max(shard, 1):.2f} of a core per shard)"
    )
    print(f"  mean evaluation tick under that load    : {report.tick_mean_s * 1000:>8.1f} ms")
    shard_note = f" (shard 0 of {latency_shards})" if latency_shards > 1 else ""
    shard_note += ", frames spread over each second" if spread else ", each second's frames in one burst"
    shard_note += (
        f", rules without for at frame arrival every {report.frame_arrivals_s:g} s"
        if report.frame_arrivals_s
        else ", frames evaluated at ticks only"
    )
    print(
        f"  fault-to-action at 1 s ticks, {latency_nodes} nodes at 1 Hz{shard_note}: "
        f"{report.latency_faults_detected}/{faults} faults acted on, "
        f"p50 {report.latency_p50_s} s, p99 {report.latency_p99_s} s, "
        f"{report.latency_frames_dropped} frames dropped; the controller's process "
        f"{report.latency_core} of a core, {report.latency_frame_arrivals_core} of it frame arrivals"
    )
    print(
        f"  XID 79 -> first action, {latency_nodes} nodes at 1 Hz{shard_note}: "
        f"{report.xid_acted}/{report.xid_events} acted on {report.xid_first_kinds}, "
        f"p50 {report.xid_p50_s} s, p99 {report.xid_p99_s} s"
    )
    if report.agent_xid is not None:
        print("  " + agent_xid.line(agent_xid.Summary(**report.agent_xid)))
    return 0
