"""From the agent's NVML XID event to the cordon's call at the scheduler actuator (#43, item 2), stage by
stage: ``healer bench controller --agent-xid N`` and benchmarks/agent_to_cordon.py.

Real agent processes (spawned), each running several real ``daemon.Agent`` instances, one node each: the
agent's own frame loop (every second, from a one-node ``SimSource``: the simulator's GPU, as ``healer
agent --source sim`` has it), its own ``XidWatcher`` in its own thread, its spool (fsynced) and its
durable event publish. The watcher waits on ``EventNvml``, a stand-in for the NVML event set only (the
five calls the watcher makes; no other NVML call is made by these agents): ``inject`` hands the waiting
``nvmlEventSetWait_v2`` the event at once, as the driver would. A real nats-server and the real
controller with the 10,000-node inventory and the burst's settings (healer/evals/burst_bench.py: limits
set to allow the faults); the rest of the fleet is identities, no frames. Single faults, not a burst:
each process injects one fatal XID 48 per agent, one every ``gap_s``, the processes staggered.

Each fault is stamped at every hand-over, on this machine's ``time.time()`` in every process:
``injected`` (given to the NVML stand-in), ``watched`` (the watcher built its event: the event's ``ts``),
``spooled`` (the agent's loop spooled it, fsync included), ``stored`` (JetStream acknowledged the
publish), ``fetched`` (the controller's pull handed it to the rule engine), ``evaluated`` (the engine
evaluated it: at arrival or in a tick), ``spawned`` (the incident shell opened the incident: its repeat
count and its record in KV, its ``opened`` change published; its actions' task spawned) and ``asked``
(the action runner asked the scheduler actuator to cordon, after its own records; a recording actuator,
no scheduler's own time). ``behind`` says what held the controller's turn when it was fetched (an index
in ``HOLDERS``).

The agents run with the kernel-log watcher off, so an NVML XID is published at once; with it on (the
default) the hold adds what the kernel line takes to arrive, up to ``xid_log_wait_s``
(benchmarks/xid_hold.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import multiprocessing
import pathlib
import queue
import statistics
import tempfile
import time
import types
from typing import Any

import structlog

from healer import config, testing
from healer.agent import daemon
from healer.bus import embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.controller.core import service
from healer.evals import burst_bench
from healer.schemas import codec, events
from healer.sim import node_source
from healer.telemetry import watchers, xid

GPUS = 8
STAGES = ("injected", "watched", "spooled", "stored", "fetched", "evaluated", "spawned", "asked")
"""The hand-overs each fault is stamped at, in order (module docstring)."""
HOLDERS = ("none", "tick", "frame arrivals", "event arrivals", "rules reload", "closer")
"""What held the controller's turn when a fault was fetched (``behind``: its index here)."""
STEPS = ("none", "firings", "domains", "fail-slow", "retries", "ladders")
"""Which of the incident shell's steps was running then (``step``: its index here; in a tick or an
arrival evaluation)."""


class EventNvml:
    """The NVML event set and nothing else: what ``XidWatcher`` calls, on ``queue.Queue``s. ``inject``
    is the driver reporting an XID on one GPU: every set registered for XIDs gets it at once."""

    XID_EVENT = 0x8
    DBE_EVENT = 0x2

    def __init__(self, gpus: int = GPUS) -> None:
        self.gpus = gpus
        self.sets: list[queue.Queue[tuple[int, int, int]]] = []

    def inject(self, index: int, code: int) -> None:
        for s in self.sets:
            s.put((index, self.XID_EVENT, code))

    def module(self) -> types.ModuleType:
        nv = types.ModuleType("bench_nvml_events")

        class NVMLError(Exception):
            pass

        class NVMLError_Timeout(NVMLError):  # pynvml's name
            pass

        def wait(event_set: queue.Queue[tuple[int, int, int]], timeout_ms: int) -> Any:
            try:
                index, kind, data = event_set.get(timeout=timeout_ms / 1000.0)
            except queue.Empty:
                raise NVMLError_Timeout("timeout") from None
            return types.SimpleNamespace(device=index, eventType=kind, eventData=data)

        def create() -> queue.Queue[tuple[int, int, int]]:
            self.sets.append(queue.Queue())
            return self.sets[-1]

        fields: dict[str, Any] = {
            "NVMLError": NVMLError, "NVMLError_Timeout": NVMLError_Timeout,
            "nvmlEventTypeXidCriticalError": self.XID_EVENT, "nvmlEventTypeDoubleBitEccError": self.DBE_EVENT,
            "nvmlInit": lambda: None, "nvmlShutdown": lambda: None, "nvmlEventSetCreate": create,
            "nvmlDeviceGetCount": lambda: self.gpus, "nvmlDeviceGetHandleByIndex": lambda i: i,
            "nvmlDeviceRegisterEvents": lambda handle, mask, event_set: None,
            "nvmlDeviceGetUUID": lambda handle: f"GPU-bench-{handle}", "nvmlDeviceGetIndex": lambda d: d,
            "nvmlEventSetWait_v2": wait, "nvmlEventSetFree": lambda event_set: None,
        }  # fmt: skip
        for name, value in fields.items():
            setattr(nv, name, value)
        return nv


class _StampedAgent(daemon.Agent):
    """The real agent; ``emit`` (on its loop: spool with fsync, wake the sender) stamped when done."""

    spooled: dict[str, float]

    def emit(self, event: events.NodeEvent) -> None:
        super().emit(event)
        if event.kind == "xid":
            self.spooled.setdefault(self.node, time.time())


def _agents(url: str, nodes: list[str], state: str, gap_s: float, go: Any, result: Any) -> None:
    """One agent process: an ``Agent`` per node, then one XID per node, ``gap_s`` apart; puts "ready",
    then each node's agent-side stamps."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))

    async def main() -> dict[str, dict[str, float]]:
        bus = await natsbus.NatsBus.connect(url, name="bench-agents")
        stamps: dict[str, dict[str, float]] = {n: {} for n in nodes}
        publish = bus.publish_durable

        async def stored(subject: str, data: bytes, **kw: Any) -> Any:
            out = await publish(subject, data, **kw)
            node = subject.rsplit(".", 1)[-1]
            if "injected" in stamps.get(node, {}) and codec.decode_event(data).kind == "xid":
                stamps[node].setdefault("stored", time.time())
            return out

        bus.publish_durable = stored  # type: ignore[method-assign,assignment]
        fakes = {n: EventNvml() for n in nodes}
        spooled: dict[str, float] = {}
        agents = []
        for n in nodes:
            w = watchers.Combined([xid.XidWatcher(n, fakes[n].module())], hold_s=0.0)
            src = node_source.SimSource(n, GPUS)
            a = _StampedAgent(node=n, source=src, bus=bus, state_dir=pathlib.Path(state) / n, watcher=w)
            a.spooled = spooled
            agents.append(a)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(a.run(stop)) for a in agents]
        await burst_bench._until(lambda: all(a.seq > 0 for a in agents), 60.0)
        result.put("ready")
        await asyncio.to_thread(go.get, True, 120)
        for n in nodes:
            stamps[n]["injected"] = time.time()
            fakes[n].inject(3, burst_bench.XID)
            await asyncio.sleep(gap_s)
        await asyncio.sleep(2.0)  # the last events published
        stop.set()
        await asyncio.wait(tasks, timeout=10)
        await bus.close()
        for n in nodes:
            if n in spooled:
                stamps[n]["spooled"] = spooled[n]
        return stamps

    result.put(asyncio.run(main()))


def _stamp_controller(ctl: service.Controller, stamps: dict[str, dict[str, float]]) -> None:
    """``fetched`` when the pull hands an XID to the engine (and whether the turn was held then),
    ``evaluated`` when the engine next evaluates events (at arrival or in a tick): wrappers on this
    controller's engine object, nothing changed in the controller."""
    eng = ctl.ingest.engine
    ingest_event, arrivals, evaluate = eng.ingest_event, eng.evaluate_arrivals, eng.evaluate
    waiting: list[str] = []

    def fetched(event: events.NodeEvent) -> Any:
        if event.kind == "xid" and event.node in stamps:
            s = stamps[event.node]
            s.setdefault("watched", event.ts)
            s.setdefault("fetched", time.time())
            s.setdefault("behind", float(HOLDERS.index(holding[0]) if holding else 0))
            s.setdefault("step", float(STEPS.index(steps[-1]) if steps else 0))
            waiting.append(event.node)
        return ingest_event(event)

    def evaluated(path: float) -> None:
        for node in waiting:
            stamps[node].setdefault("evaluated", time.time())
            stamps[node].setdefault("in_tick", path)
        waiting.clear()

    def at_arrival(now: float) -> Any:
        evaluated(0.0)
        return arrivals(now)

    def in_tick(now: float) -> Any:
        evaluated(1.0)
        return evaluate(now)

    eng.ingest_event, eng.evaluate_arrivals, eng.evaluate = fetched, at_arrival, in_tick  # type: ignore[method-assign]
    shell = ctl.incidents
    spawn = shell.spawn

    def spawned(inc: Any) -> None:
        if inc.node in stamps:
            stamps[inc.node].setdefault("spawned", time.time())
        spawn(inc)

    shell.spawn = spawned  # type: ignore[method-assign]
    holding: list[str] = []  # what holds the turn now, outermost first
    _held(holding, ctl.ticker, "tick", lambda *a: "tick")
    _held(holding, ctl.ticker, "_arrivals_guarded", lambda frames=False: HOLDERS[2 if frames else 3])
    _held(holding, ctl.reloader, "maybe_reload", lambda *a: "rules reload")
    _held(holding, ctl.closer, "apply", lambda *a: "closer")
    steps: list[str] = []
    for name, step in zip(
        ("handle", "correlate_domains", "failslow", "retry_and_escalate"), STEPS[1:], strict=False
    ):
        _held(steps, shell, name, lambda *a, _s=step: _s)
    _held(steps, shell.recovery, "advance", lambda *a, **kw: "ladders")


def _held(holding: list[str], obj: Any, name: str, label: Any) -> None:
    """Wrap ``obj.name`` (a coroutine function that holds the turn) to note it in ``holding`` while it
    runs."""
    inner = getattr(obj, name)

    async def wrapped(*args: Any, **kw: Any) -> Any:
        holding.append(label(*args, **kw))
        try:
            return await inner(*args, **kw)
        finally:
            holding.pop()

    setattr(obj, name, wrapped)


async def measure(
    url: str, processes: int, per: int, gap_s: float, work: pathlib.Path, rules_dir: str = "rules"
) -> list[dict[str, float]]:
    """Each fault's stamps (``STAGES``; those a fault did not reach are missing)."""
    inventory = work / "inventory.yaml"
    burst_bench.write_inventory(inventory)
    timed = burst_bench.Timed(testing.RecordingActuator())
    bus = await natsbus.NatsBus.connect(url, name="bench-agent-controller")
    cfg = burst_bench.settings(url, rules_dir, inventory, burst_bench.FLEET)
    ctl = await service.build(cfg, bus, scheduler=timed, gpu=testing.RecordingGpuActuator())
    step = burst_bench.FLEET // (processes * per)
    names = [burst_bench.node_name(i * step) for i in range(processes * per)]
    stamps: dict[str, dict[str, float]] = {n: {} for n in names}
    _stamp_controller(ctl, stamps)
    await ctl.start()
    ctx = multiprocessing.get_context("spawn")
    procs, gos, results = [], [], []
    try:
        await burst_bench._until(lambda: ctl.role.took_over, 60.0)
        for p in range(processes):
            go, res = ctx.Queue(), ctx.Queue()
            nodes = names[p * per : (p + 1) * per]
            args = (url, nodes, str(work / f"agents{p}"), gap_s, go, res)
            proc = ctx.Process(target=_agents, args=args, daemon=True)
            proc.start()
            procs.append(proc)
            gos.append(go)
            results.append(res)
        for res in results:
            assert await asyncio.to_thread(res.get, True, 120) == "ready"
        for go in gos:  # staggered: the processes' faults interleave, one at a time
            go.put(True)
            await asyncio.sleep(gap_s / processes)
        for res in results:
            for node, s in (await asyncio.to_thread(res.get, True, 120)).items():
                stamps[node].update(s)
        await burst_bench._until(lambda: all((burst_bench.CONTAIN, n) in timed.asked for n in names), 30.0)
    finally:
        for proc in procs:
            await asyncio.to_thread(proc.join, 15)
        await ctl.stop()
        await bus.close()
    for n in names:
        if (burst_bench.CONTAIN, n) in timed.asked:
            stamps[n]["asked"] = timed.asked[(burst_bench.CONTAIN, n)]
    return [stamps[n] for n in names]


async def run(processes: int, per: int, gap_s: float, rules_dir: str = "rules") -> list[dict[str, float]]:
    """``measure`` on a nats-server of its own."""
    with tempfile.TemporaryDirectory() as tmp, embedded.EmbeddedServer(pathlib.Path(tmp) / "nats") as srv:
        b = await natsbus.NatsBus.connect(srv.url)
        await provision.ensure(b, subjects.Subjects(), config.NatsSettings())
        await b.close()
        return await measure(srv.url, processes, per, gap_s, pathlib.Path(tmp), rules_dir)


@dataclasses.dataclass
class Summary:
    faults: int
    acted: int
    p50_s: float | None
    """Injected at the NVML stand-in → cordon asked of the scheduler actuator."""
    p99_s: float | None
    max_s: float | None
    stages_p50_ms: dict[str, float]
    """Each hand-over's median, from the stage before it (``STAGES``)."""
    slowest: list[dict[str, Any]]
    """The slowest faults (up to 3), each stage's share in ms, and what held the turn at fetch."""
    behind: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    """By what held the controller's turn when a fault was fetched (``HOLDERS``): how many faults, and
    their wait from fetched to evaluated (median and max, ms)."""


def _spans(s: dict[str, float]) -> dict[str, float]:
    out = {}
    for a, b in itertools.pairwise(STAGES):
        if a in s and b in s:
            out[b] = round(1000 * (s[b] - s[a]), 1)
    return out


def summarise(stamps: list[dict[str, float]]) -> Summary:
    done = [s for s in stamps if "asked" in s and "injected" in s]
    lat = sorted(s["asked"] - s["injected"] for s in done)
    p50 = p99 = top = None
    if lat:
        q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) >= 2 else [lat[0]] * 99
        p50, p99, top = round(statistics.median(lat), 4), round(q[98], 4), round(lat[-1], 4)
    spans = [_spans(s) for s in done]
    medians = {
        k: round(statistics.median([sp[k] for sp in spans if k in sp]), 1)
        for k in STAGES[1:]
        if any(k in sp for sp in spans)
    }
    slow = sorted(done, key=lambda s: s["asked"] - s["injected"], reverse=True)[:3]
    slowest = [
        {"total_ms": round(1000 * (s["asked"] - s["injected"]), 1), **_spans(s),
         "behind": HOLDERS[int(s.get("behind", 0))], "step": STEPS[int(s.get("step", 0))],
         "in_tick": s.get("in_tick", -1.0)}
        for s in slow
    ]  # fmt: skip
    waits: dict[str, list[float]] = {}
    for s in done:
        if "fetched" in s and "evaluated" in s:
            wait = 1000 * (s["evaluated"] - s["fetched"])
            waits.setdefault(HOLDERS[int(s.get("behind", 0))], []).append(wait)
    behind = {
        k: {"faults": len(v), "wait_p50_ms": round(statistics.median(v), 1), "wait_max_ms": round(max(v), 1)}
        for k, v in sorted(waits.items())
    }
    return Summary(len(stamps), len(done), p50, p99, top, medians, slowest, behind)


async def figure(agents: int, rules_dir: str = "rules", gap_s: float = 0.2) -> Summary:
    """``healer bench controller --agent-xid N``: N agents in up to 4 processes (N rounded down to a
    multiple of them), one XID each, summarised."""
    processes = max(1, min(4, agents))
    return summarise(await run(processes, max(1, agents // processes), gap_s, rules_dir))


def line(s: Summary) -> str:
    """The bench's line for the agent path, beside the controller-receipt XID figure."""
    ms = [None if v is None else round(1000 * v, 1) for v in (s.p50_s, s.p99_s, s.max_s)]
    return (
        f"agent NVML XID 48 -> cordon asked, real agents, 10,000-node fleet: {s.acted}/{s.faults} acted on,"
        f" p50 {ms[0]} ms, p99 {ms[1]} ms, max {ms[2]} ms; stage medians (ms) {s.stages_p50_ms};"
        f" fetched while the turn was held by: {s.behind}"
    )
