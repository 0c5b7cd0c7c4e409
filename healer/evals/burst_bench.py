"""``healer bench burst``: N fatal XIDs at once in a 10,000-node fleet, timed from the burst to every node's
containment (its cordon done) and to every node's recovery ladder started (its first rung, the GPU
reset, asked of the node's agent) (#43).

The fleet is 10,000 node identities with their inventory (``admission: file``, racks of 40 nodes), not
10,000 processes. A separate process publishes the burst: one durable XID 48 event per faulty node, as
fast as it can, on a real nats-server. The controller is the real one, in enforce mode, with the default
rule pack (``xid-fatal``: cordon, migrate; the ``reset-then-reboot`` ladder), and with its safety limits
**set to allow the burst** (a measurement of speed, not of safety; the shipped breaker's behaviour under
a burst is tests/controller/test_burst.py):

- ``breaker_max_nodes`` = the fleet, ``breaker_max_percent`` = 100;
- ``domain_limits: {rack: {max_percent: 100}}`` (counted per node, never reached);
- ``actions_per_minute`` = 100,000 (the shipped 60 would pace the burst at one per second);
- ``shared_cause_window_s`` = 0 (else 3 nodes of one rack make one shared-cause incident and hold the
  rest: the right answer to a real rack fault, not the roll-out this models).

The scheduler actuator is whatever the caller passes (recording, the real Slurm, a fake Kubernetes API
server: benchmarks/burst.py); the node agent's GPU reset is a recording actuator (no agents run). Every
request and outcome is timed at the actuator boundary (``Timed``). The controller's CPU is this process's
(the publisher and any API server run in other processes); a scheduler's subprocesses are reported
apart (``children_cpu_s``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import pathlib
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import structlog
import yaml

from healer import config, testing
from healer.actuators import base
from healer.bus import embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.controller.core import service
from healer.schemas import codec, events

FLEET = 10_000
RACK_SIZE = 40
BURSTS = (100, 200, 400, 1000)
XID = 48
CONTAIN = "cordon"
"""The request kind whose outcome is a node's containment (``xid-fatal``'s first action)."""
LADDER = "reset_gpu"
"""The request kind that starts a node's ladder (``reset-then-reboot``'s first rung, to the agent)."""
PUBLISHED: dict[int, dict[str, float]] = {
    200: {"contained_all_s": 2.75, "contained_p50_s": 1.38, "contained_p99_s": 2.80,
          "ladders_all_s": 15.78, "ladders_p50_s": 7.85, "ladders_p99_s": 15.87},
    1000: {"contained_all_s": 16.34, "contained_p50_s": 8.51, "contained_p99_s": 16.33,
           "ladders_all_s": 76.47, "ladders_p50_s": 38.03, "ladders_p99_s": 75.77},
}  # fmt: skip
"""NVIDIA NVSentinel's published burst figures (its PR #1789, 2026-09; 10,000-node simulated fleet):
all cordoned and all remediations started. Published there, not measured here."""


def node_name(i: int) -> str:
    return f"gpu-{i:05d}"


def victims(n: int, fleet: int = FLEET) -> list[str]:
    """The burst's nodes: every ``fleet // n``-th node, so the burst spans the racks."""
    step = max(1, fleet // n)
    return [node_name(i) for i in range(0, fleet, step)][:n]


class Timed:
    """Wraps an actuator: when each node's first request of each kind arrived and when its outcome came
    back, with the outcome's status (``time.time()``, comparable with the publisher's clock)."""

    def __init__(self, inner: base.Actuator) -> None:
        self.inner = inner
        self.name = inner.name
        self.asked: dict[tuple[str, str], float] = {}
        self.done: dict[tuple[str, str], float] = {}
        self.status: dict[tuple[str, str], str] = {}

    async def apply(self, request: base.ActionRequest) -> base.ActionOutcome:
        key = (str(request.kind), request.node)
        self.asked.setdefault(key, time.time())
        outcome = await self.inner.apply(request)
        self.done.setdefault(key, time.time())
        self.status[key] = str(outcome.status)
        return outcome

    def __getattr__(self, name: str) -> Any:  # the scheduler's optional capabilities (reboot_status ...)
        return getattr(self.inner, name)


def write_inventory(path: pathlib.Path, fleet: int = FLEET) -> None:
    nodes = [{"name": node_name(i), "rack": f"r{i // RACK_SIZE:04d}"} for i in range(fleet)]
    path.write_text(yaml.safe_dump({"nodes": nodes}, sort_keys=False))


def settings(url: str, rules_dir: str, inventory: pathlib.Path, fleet: int, **extra: Any) -> config.Settings:
    """The controller's settings for the burst: limits set to allow it (module docstring)."""
    cs = {
        "rules_dir": rules_dir, "mode": "enforce", "tick_s": 1.0, "admission": "file",
        "inventory_file": str(inventory), "breaker_max_nodes": fleet, "breaker_max_percent": 100.0,
        "domain_limits": {"rack": {"max_percent": 100.0}}, "actions_per_minute": 100_000,
        "shared_cause_window_s": 0.0, **extra,
    }  # fmt: skip
    return config.Settings(
        nats=config.NatsSettings(url=url), controller=config.ControllerSettings.model_validate(cs)
    )


def _inject(url: str, nodes: list[str], result: Any) -> None:
    """A separate process: one durable fatal XID per node, pipelined, as fast as it can; reports the
    time of the first publish and each node's."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))

    async def main() -> dict[str, Any]:
        bus = await natsbus.NatsBus.connect(url, name="bench-burst")
        subj = subjects.Subjects()
        encoded = []
        for node in nodes:
            event = events.new(node, "xid", gpu_index=3, xid=XID, message="Xid 48: DBE (double bit error)")
            encoded.append((node, subj.events(node), codec.encode(event), event.id))
        sent: dict[str, float] = {}

        async def one(node: str, subject: str, data: bytes, msg_id: str) -> None:
            sent[node] = time.time()
            await bus.publish_durable(subject, data, msg_id=msg_id)

        start = time.time()
        for i in range(0, len(encoded), 100):
            await asyncio.gather(*(one(*e) for e in encoded[i : i + 100]))
        await bus.close()
        return {"start": start, "sent": sent, "acked": time.time()}

    result.put(asyncio.run(main()))


def inject(url: str, nodes: list[str]) -> tuple[Any, Any]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_inject, args=(url, nodes, queue), daemon=True)
    proc.start()
    return proc, queue


@dataclasses.dataclass
class Stage:
    """One stage of the burst, every node's time from the burst's first publish."""

    done: int
    all_s: float | None
    p50_s: float | None
    p99_s: float | None
    nodes_per_s: float | None
    """Nodes through the stage per second, from its first node to its last."""
    statuses: dict[str, int] = dataclasses.field(default_factory=dict)


def stage(times: list[float], statuses: list[str]) -> Stage:
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s] = counts.get(s, 0) + 1
    if not times:
        return Stage(0, None, None, None, None, counts)
    times = sorted(times)
    q = statistics.quantiles(times, n=100, method="inclusive") if len(times) >= 2 else [times[0]] * 99
    span = times[-1] - times[0]
    rate = round((len(times) - 1) / span, 1) if span > 0 else None
    median = round(statistics.median(times), 3)
    return Stage(len(times), round(times[-1], 3), median, round(q[98], 3), rate, counts)


@dataclasses.dataclass
class Result:
    backend: str
    n: int
    fleet: int
    publish_s: float
    """From the first publish to the last one acknowledged by JetStream."""
    contained: Stage
    """The cordon's outcome back from the scheduler actuator."""
    ladders: Stage
    """The ladder's first rung (reset_gpu) asked of the node's agent."""
    cpu_s: float
    """This process's CPU (the controller) from the burst to its last ladder start (or the timeout)."""
    children_cpu_s: float
    """CPU of the subprocesses it ran in that span (Slurm's commands)."""
    wall_s: float


async def burst(
    url: str,
    n: int,
    scheduler: base.Actuator,
    backend: str,
    workdir: pathlib.Path,
    rules_dir: str = "rules",
    fleet: int = FLEET,
    timeout_s: float = 120.0,
    **extra: Any,
) -> Result:
    """One burst of ``n`` against a fresh controller on ``url`` (a provisioned, empty server)."""
    inventory = workdir / "inventory.yaml"
    if not inventory.exists():
        write_inventory(inventory, fleet)
    timed = Timed(scheduler)
    gpu = Timed(testing.RecordingGpuActuator())
    bus = await natsbus.NatsBus.connect(url, name="bench-burst-controller")
    cfg = settings(url, rules_dir, inventory, fleet, **extra)
    ctl = await service.build(cfg, bus, scheduler=timed, gpu=gpu)
    await ctl.start()
    try:
        await _until(lambda: ctl.role.took_over and len(ctl.admission.admitted) >= fleet, 60.0)
        # A controller that has run a while: its periodic listings of the scheduler's node labels and
        # jobs (every labels_refresh_s, jobs_refresh_s; 10,000 nodes on Kubernetes) are done, not
        # landing inside the burst as the first ones would, 2 s after the start.
        await ctl.housekeeping.refresh_labels()
        await ctl.housekeeping.refresh_jobs()
        nodes = victims(n, fleet)
        t0, c0, k0 = time.time(), time.process_time(), _children()
        proc, queue = inject(url, nodes)
        sent = await asyncio.to_thread(queue.get, True, 60)
        await asyncio.to_thread(proc.join, 10)
        await _until(lambda: all((LADDER, v) in gpu.asked for v in nodes), timeout_s)
        t1, c1, k1 = time.time(), time.process_time(), _children()
    finally:
        await ctl.stop()
        await bus.close()
    start = sent["start"]
    contained = [timed.done[(CONTAIN, v)] - start for v in nodes if (CONTAIN, v) in timed.done]
    statuses = [timed.status[(CONTAIN, v)] for v in nodes if (CONTAIN, v) in timed.status]
    ladders = [gpu.asked[(LADDER, v)] - start for v in nodes if (LADDER, v) in gpu.asked]
    return Result(
        backend=backend, n=n, fleet=fleet, publish_s=round(sent["acked"] - start, 3),
        contained=stage(contained, statuses), ladders=stage(ladders, []),
        cpu_s=round(c1 - c0, 2), children_cpu_s=round(k1 - k0, 2), wall_s=round(t1 - t0, 2),
    )  # fmt: skip


def _children() -> float:
    import os

    t = os.times()
    return t.children_user + t.children_system


async def _until(done: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def fresh_server_burst(
    n: int, make: Callable[[], base.Actuator], backend: str, workdir: pathlib.Path, **kw: Any
) -> Result:
    """``burst`` on a nats-server of its own (no incident of an earlier burst to join)."""
    with embedded.EmbeddedServer(workdir / f"nats-{backend}-{n}") as srv:
        b = await natsbus.NatsBus.connect(srv.url)
        await provision.ensure(b, subjects.Subjects(), config.NatsSettings())
        await b.close()
        return await burst(srv.url, n, make(), backend, workdir, **kw)


def table(results: list[Result]) -> str:
    """The report: measured rows, then the peer's published rows, labelled."""
    head = (
        f"{'source':<28} {'N':>5} {'contained':>9} {'all s':>7} {'p50 s':>7} {'p99 s':>7} {'nodes/s':>8}"
        f" {'ladders':>7} {'all s':>7} {'p50 s':>7} {'p99 s':>7} {'nodes/s':>8} {'ctl CPU s':>9}"
    )
    lines = [head]

    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:g}"

    for r in results:
        c, lad = r.contained, r.ladders
        lines.append(
            f"{'measured: ' + r.backend:<28} {r.n:>5} {c.done:>9} {f(c.all_s):>7} {f(c.p50_s):>7}"
            f" {f(c.p99_s):>7} {f(c.nodes_per_s):>8} {lad.done:>7} {f(lad.all_s):>7} {f(lad.p50_s):>7}"
            f" {f(lad.p99_s):>7} {f(lad.nodes_per_s):>8} {r.cpu_s:>9g}"
        )
    for n, p in PUBLISHED.items():
        lines.append(
            f"{'published: NVSentinel':<28} {n:>5} {'':>9} {p['contained_all_s']:>7g}"
            f" {p['contained_p50_s']:>7g} {p['contained_p99_s']:>7g} {'':>8} {'':>7}"
            f" {p['ladders_all_s']:>7g} {p['ladders_p50_s']:>7g} {p['ladders_p99_s']:>7g}"
        )
    return "\n".join(lines)


def main(bursts: list[int], rules_dir: str, as_json: bool, fleet: int = FLEET) -> int:
    """``healer bench burst``: the recording scheduler (the controller alone); benchmarks/burst.py adds the
    real Slurm and the fake Kubernetes API server."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in bursts:
            results.append(
                asyncio.run(
                    fresh_server_burst(
                        n, testing.RecordingActuator, "recording scheduler", pathlib.Path(tmp),
                        rules_dir=rules_dir, fleet=fleet,
                    )
                )
            )  # fmt: skip
    if as_json:
        print(json.dumps([dataclasses.asdict(r) for r in results], indent=2))
    else:
        print(f"burst of fatal XIDs in a {fleet:,}-node fleet, limits set to allow the burst")
        print(table(results))
    return 0
