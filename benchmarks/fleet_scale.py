"""Fleet scale (issue #29): a 12,500-node x 8-GPU fleet (100,000 GPUs) on a real 3-node NATS JetStream
cluster with controller shards, each shard a leader and a standby, all of them real processes.

What runs, every piece a separate process this script starts and stops by its PID:

- three ``nats-server`` processes routed into one JetStream cluster (``healer.bus.embedded``), streams
  and buckets with 3 replicas, as production runs it;
- ``--shards`` shards x 2 ``healer controller`` processes (``--shards S --shard i``, enforce mode, the
  log actuator, the default rule pack, ``admission: first-seen``): per shard one wins the lease
  (``healer-leases``), the other is its warm standby;
- ``--publishers`` ``healer sim`` processes (scenario ``healthy``), which play the nodes: ``--nodes``
  in all, split between them (names ``fs<p>-NNNNN``), one 8-GPU frame per node every ``--interval``
  seconds;
- this process injects ``--faults`` fatal XIDs (XID 79 on GPU 3, published durably on the node's events
  subject at a known time on a known node, spread over the shards) and reads the incident feed; a
  fault's action is the first cordon the feed reports for its node (the ``at`` of the action record);
- at ``--kill-at`` of the window it SIGKILLs shard 0's leader (the PID the lease names, a process this
  script started). The standby must take the lease (it lapses one TTL after the dead leader's last
  renewal) and take over; the faults injected while shard 0 had no leader wait in JetStream for it.
  Every injected fault must get its action.

**Reduced rate, not real time.** By default every node sends one frame every 20 s (``--interval 20``):
625 frames/s instead of 12,500, i.e. 1/20 of the 1 Hz load, so that three servers, eight controllers
and four publishers fit on a 2-core machine shared with other work. Everything else is as at 1 Hz: the
fleet state is 12,500 nodes x 8 GPUs, each controller receives every frame of the fleet (a shard skips
the other shards' frames after a CRC32 of the subject), the rules evaluate every second (``tick_s`` 1),
and the XID path (events act at arrival) does not depend on the frame rate. The publishers start
``interval / publishers`` apart, so their bursts (each sends its nodes' frames at once) spread over the
interval. The report's ``at_1hz`` scales the measured figures to 1 Hz linearly in frames (each process's
fleet frames per CPU second; the servers' CPU per frame): that counts the per-second costs (ticks, leases)
as if they grew with the frame rate, so it is an upper bound. docs/performance.md ("Sizing") fits a line
through two runs instead (``--interval 20`` and ``--interval 10``: a fixed cost per second and a cost per
frame). For the real-time form on a machine with the cores for it: ``--interval 1``.

    .venv/bin/python benchmarks/fleet_scale.py                      # 12,500 nodes, 1 frame / 20 s
    .venv/bin/python benchmarks/fleet_scale.py --interval 1         # 100,000 GPUs at 1 Hz (big machine)
    .venv/bin/python benchmarks/fleet_scale.py --nodes 20 --shards 2 --duration 20 --json   # a toy

Prints a report (``--json``: one JSON document); exit 1 when a fault went unacted or the standby did
not take over. The figures go to docs/performance.md ("Sizing").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import orjson
import structlog
import yaml
from prometheus_client import parser as prom_parser

from healer import config
from healer.bus import base, embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.controller.core import service
from healer.controller.store import kv
from healer.schemas import codec, events
from healer.sim import scenarios

ROOT = pathlib.Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
XID = 79
FAULT_GPU = 3


# --- processes ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Proc:
    """A process this script started: only it is ever signalled, by its PID."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: pathlib.Path
    out_path: pathlib.Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None


def start_proc(name: str, args: list[str], workdir: pathlib.Path) -> Proc:
    log_path, out_path = workdir / f"{name}.log", workdir / f"{name}.out"
    with log_path.open("ab") as err, out_path.open("ab") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "healer", *args], cwd=ROOT, stdout=out, stderr=err,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    return Proc(name, popen, log_path, out_path)


def stop_procs(procs: list[Proc], grace_s: float = 20.0) -> None:
    """SIGTERM every process still running, wait, then SIGKILL the rest (each by its own PID)."""
    for p in procs:
        if p.alive:
            with contextlib.suppress(ProcessLookupError):
                p.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.popen.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.popen.wait(10)


@dataclasses.dataclass
class ProcSample:
    cpu_s: float
    rss_mib: float
    hwm_mib: float


def sample(pid: int) -> ProcSample | None:
    """CPU seconds (user + system) from /proc/<pid>/stat; VmRSS and VmHWM from /proc/<pid>/status."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime: fields 14 and 15 of stat
    mem = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            mem[key] = int(value.split()[0]) / 1024
    return ProcSample(cpu, mem.get("VmRSS", 0.0), mem.get("VmHWM", 0.0))


def scrape(port: int) -> dict[str, float]:
    """A controller's /metrics, each metric name's samples summed over their labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in prom_parser.text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out


def log_time(path: pathlib.Path, event: str) -> float | None:
    """The time of the first JSON log line of ``event`` in a controller's log, as a unix time."""
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            if f'"{event}"' not in line:
                continue
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if doc.get("event") == event:
                    return datetime.datetime.fromisoformat(doc["timestamp"]).timestamp()
    return None


# --- the run --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Controller:
    shard: int
    role: str
    """``a`` or ``b``: which of the shard's two processes (the lease decides which leads)."""
    port: int
    proc: Proc
    nodes: int
    """Nodes of its shard."""
    rss_idle_mib: float = 0.0
    start: ProcSample | None = None
    start_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    end: ProcSample | None = None
    end_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    end_at: float = 0.0
    start_at: float = 0.0

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclasses.dataclass
class Fault:
    node: str
    shard: int
    at: float
    """When this process published the XID (unix time)."""
    acted_at: float | None = None
    action: str | None = None
    during_failover: bool = False
    """Injected on shard 0 while it had no leader (between the kill and the standby's takeover)."""


def plan_faults(
    names: list[str], shards: int, faults: int, duration: float, kill_at: float, ttl: float
) -> list[tuple[float, str, int]]:
    """(offset in the window, node, shard): evenly spread; the ones due within a TTL after the kill
    are on shard 0 (they wait in JetStream for its standby); the others cycle over the shards."""
    by_shard: dict[int, list[str]] = {s: [] for s in range(shards)}
    for n in names:
        by_shard[service.shard_of(n, shards)].append(n)
    used = {s: 0 for s in range(shards)}
    out = []
    for k in range(faults):
        t = (k + 0.5) * duration / faults
        s = 0 if kill_at <= t <= kill_at + ttl else k % shards
        pool = by_shard[s]
        if not pool:
            continue
        stride = max(1, len(pool) // max(1, faults))
        node = pool[(used[s] * stride) % len(pool)]
        used[s] += 1
        out.append((t, node, s))
    return out


def _quantiles(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    q99 = statistics.quantiles(values, n=100, method="inclusive")[98] if len(values) >= 2 else values[0]
    return round(statistics.median(values), 3), round(q99, 3)


async def _lease_holders(store: kv.Store, shards: int) -> dict[int, str | None]:
    out: dict[int, str | None] = {}
    for s in range(shards):
        try:
            doc = await store.get(f"leader.shard-{s}")
        except Exception:  # a lease read during an election: seen as no holder
            doc = None
        out[s] = str(doc.value.get("holder")) if doc is not None else None
    return out


def _pid_of(holder: str | None) -> int | None:
    """The PID in a controller's lease holder name (``<host>-<pid>-<hex>``)."""
    if not holder:
        return None
    try:
        return int(holder.rsplit("-", 2)[1])
    except (IndexError, ValueError):
        return None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    shards, nodes, pubs = args.shards, args.nodes, max(1, min(args.publishers, args.nodes))
    ttl = args.lease_ttl
    names_of = {p: scenarios.node_names(nodes // pubs + (p < nodes % pubs), f"fs{p}") for p in range(pubs)}
    names = [n for p in range(pubs) for n in names_of[p]]
    shard_nodes = {s: sum(service.shard_of(n, shards) == s for n in names) for s in range(shards)}
    procs: list[Proc] = []
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="healer-fleet-scale-"))
    cluster = embedded.EmbeddedCluster(workdir / "nats", size=3, name="fleet-scale")
    wall0, cpu0 = time.monotonic(), time.process_time()
    try:
        cluster.start()
        settings = {
            "nats": {
                "url": cluster.url, "replicas": 3, "lease_ttl_s": ttl,
                "telemetry_max_bytes": 256 * 2**20, "telemetry_max_age_s": 600,
                "events_max_bytes": 64 * 2**20, "incidents_max_bytes": 64 * 2**20,
            },
            "controller": {
                "rules_dir": str(ROOT / "rules"), "mode": "enforce", "actuator": "log",
                "admission": "first-seen", "breaker_max_percent": 100.0,
                "breaker_max_nodes": max(50, 2 * args.faults), "actions_per_minute": 1000,
                "gpus_per_node": 8, "tick_s": 1.0, "frame_arrivals_s": args.frame_arrivals_s,
            },
            "log": {"level": "info", "format": "json"},
        }  # fmt: skip
        cfg = workdir / "healer.yaml"
        cfg.write_text(yaml.safe_dump(settings))
        s = config.load(cfg, env={})
        subj = subjects.Subjects(s.nats.prefix)
        bus = await natsbus.NatsBus.connect(s.nats.url, name="fleet-scale", nats_settings=s.nats)
        try:
            await provision.ensure(bus, subj, s.nats)
            return await _measure(args, bus, subj, s, cfg, workdir, procs, cluster, names_of, shard_nodes)
        finally:
            await bus.close()
    finally:
        stop_procs(procs)
        cluster.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        print(
            f"(this script: {time.process_time() - cpu0:.1f} s CPU, {time.monotonic() - wall0:.0f} s wall;"
            f" work dir {'kept: ' + str(workdir) if args.keep else 'removed'})",
            file=sys.stderr,
        )


async def _measure(
    args: argparse.Namespace,
    bus: natsbus.NatsBus,
    subj: subjects.Subjects,
    s: config.Settings,
    cfg: pathlib.Path,
    workdir: pathlib.Path,
    procs: list[Proc],
    cluster: embedded.EmbeddedCluster,
    names_of: dict[int, list[str]],
    shard_nodes: dict[int, int],
) -> dict[str, Any]:
    shards, ttl = args.shards, args.lease_ttl
    names = [n for ns in names_of.values() for n in ns]
    nodes = len(names)
    store = kv.Store(await bus.key_value(subj.kv_leases))

    # the incident feed: a fault's action is the first cordon reported for its node
    acted: dict[str, tuple[float, str]] = {}
    progress = asyncio.Event()

    async def on_incident(msg: base.Msg) -> None:
        with contextlib.suppress(orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            data = orjson.loads(msg.data)["data"]
            for a in data.get("actions") or []:
                if a.get("status") in ("done", "already-done") and data["node"] not in acted:
                    acted[data["node"]] = (float(a["at"]), str(a["kind"]))
                    progress.set()

    feed = await bus.subscribe(subj.all_incidents, on_incident)

    # controllers: a and b of every shard, started together; the lease picks the leader
    ctls: list[Controller] = []
    for shard in range(shards):
        for role in ("a", "b"):
            port = embedded.free_port()
            proc = start_proc(
                f"controller-{shard}{role}",
                ["controller", "--config", str(cfg), "--shards", str(shards), "--shard", str(shard),
                 "--metrics-port", str(port)],
                workdir,
            )  # fmt: skip
            procs.append(proc)
            ctls.append(Controller(shard, role, port, proc, shard_nodes[shard]))
    holders = await _wait_for(
        lambda: _leaders(store, shards, ctls), 120, "every shard's lease held by one of its controllers"
    )
    for c in ctls:  # every controller ready (the standbys too): subscribed, rules loaded, ticking
        await _wait_for(lambda c=c: _ready(c), 120, f"controller {c.proc.name} ready (/readyz)")
        c.rss_idle_mib = (sample(c.pid) or ProcSample(0, 0, 0)).rss_mib

    # publishers: `healer sim`, the fleet split between them
    sims: list[Proc] = []
    for p, ns in names_of.items():
        proc = start_proc(
            f"sim-{p}",
            ["sim", "--config", str(cfg), "--nodes", str(len(ns)), "--node-prefix", f"fs{p}",
             "--interval", str(args.interval), "--scenario", "healthy", "--seed", str(p)],
            workdir,
        )  # fmt: skip
        procs.append(proc)
        sims.append(proc)
        # staggered by interval / publishers: each publisher sends its nodes' frames in one burst per
        # interval, so P publishers make P smaller bursts spread over the interval (agents are not in step)
        if p < len(names_of) - 1:
            await asyncio.sleep(args.interval / len(names_of))

    # warm: every controller has seen every node of its shard
    async def warm() -> bool:
        for c in ctls:
            m = await asyncio.to_thread(scrape, c.port)
            if m.get("healer_controller_fleet_nodes", 0) < c.nodes:
                return False
        return True

    await _wait_for(warm, 3 * args.interval + 120, "every node seen by its shard's controllers")
    t_window = time.time()
    servers = {srv.name: srv.pid for srv in cluster.servers}
    srv_start = {name: sample(pid) for name, pid in servers.items() if pid}
    sim_start = {p.name: sample(p.pid) for p in sims}
    for c in ctls:
        c.start, c.start_at = sample(c.pid), time.time()
        c.start_metrics = await asyncio.to_thread(scrape, c.port)

    # faults, and shard 0's leader killed at kill_at
    plan = plan_faults(names, shards, args.faults, args.duration, args.kill_at * args.duration, ttl)
    faults: list[Fault] = []
    victim = next(c for c in ctls if c.pid == _pid_of(holders[0]))
    standby = next(c for c in ctls if c.shard == 0 and c is not victim)
    kill_t: float | None = None
    last_renewal_t: float | None = None
    lease_moved_t: float | None = None
    new_holder: str | None = None

    async def watch_lease() -> None:
        nonlocal lease_moved_t, new_holder
        while True:
            h = (await _lease_holders(store, 1))[0]
            if kill_t is not None and h is not None and _pid_of(h) == standby.pid:
                lease_moved_t, new_holder = time.time(), h
                return
            await asyncio.sleep(0.1)

    watcher = asyncio.create_task(watch_lease())
    try:
        for offset, node, shard in plan:
            now_off = time.time() - t_window
            if kill_t is None and args.kill_at * args.duration <= offset:
                await asyncio.sleep(max(0.0, args.kill_at * args.duration - now_off))
                victim.end, victim.end_at = sample(victim.pid), time.time()
                victim.end_metrics = await asyncio.to_thread(scrape, victim.port)
                victim.proc.popen.kill()  # SIGKILL, by the PID this script started
                kill_t = time.time()
                victim.proc.popen.wait(10)
                # the dead leader's last renewal: its key stays until it lapses, one TTL after that
                with contextlib.suppress(Exception):
                    doc = await store.get("leader.shard-0")
                    if doc is not None and _pid_of(str(doc.value.get("holder"))) == victim.pid:
                        last_renewal_t = float(doc.value["at"])
                now_off = time.time() - t_window
            await asyncio.sleep(max(0.0, offset - now_off))
            event = events.new(
                node, "xid", gpu_index=FAULT_GPU, xid=XID, message="GPU has fallen off the bus"
            )
            at = time.time()
            await bus.publish_durable(subj.events(node), codec.encode(event), msg_id=event.id)
            faults.append(Fault(node, shard, at))
        # every fault's action (the last ones, and shard 0's held while it had no leader)
        deadline = time.time() + 2 * ttl + 30
        while time.time() < deadline:
            progress.clear()
            if all(f.node in acted for f in faults):
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(progress.wait(), timeout=max(0.0, deadline - time.time()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(watcher), timeout=max(0.0, deadline - time.time()))
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    t_end = time.time()
    for c in ctls:
        if c is not victim:
            c.end, c.end_at = sample(c.pid), time.time()
            c.end_metrics = await asyncio.to_thread(scrape, c.port)
    srv_end = {name: sample(pid) for name, pid in servers.items() if pid}
    varz = {srv.name: await asyncio.to_thread(_varz, srv) for srv in cluster.servers}
    sim_end = {p.name: sample(p.pid) for p in sims}

    # the publishers stop (their stats: frames sent, dropped); then what each controller ingested
    stop_procs(sims, grace_s=60)
    sim_stats: list[dict[str, Any]] = []
    for sim in sims:
        lines = [ln for ln in sim.out_path.read_text(errors="replace").splitlines() if ln.startswith("{")]
        sim_stats.append(json.loads(lines[-1]) if lines else {})
    await asyncio.sleep(2.0)
    final = {c.proc.name: await asyncio.to_thread(scrape, c.port) for c in ctls if c is not victim}
    await feed.unsubscribe()

    for f in faults:
        if f.node in acted:
            f.acted_at, f.action = acted[f.node]
    took_over_t = log_time(standby.proc.log_path, "controller.took_over")
    # when the standby won the lease, by its own log (the watcher above polls the key every 0.1 s)
    lease_moved_t = log_time(standby.proc.log_path, "lease.acquired") if lease_moved_t else None
    if kill_t is not None:
        gap_end = took_over_t or lease_moved_t or t_end
        for f in faults:
            f.during_failover = f.shard == 0 and kill_t <= f.at <= gap_end
    return _report(
        args, nodes, shard_nodes, ctls, victim, standby, faults, kill_t, last_renewal_t, lease_moved_t,
        took_over_t, new_holder, t_window, t_end, srv_start, srv_end, varz, sim_start, sim_end, sim_stats,
        final, names_of,
    )  # fmt: skip


def _varz(srv: embedded.EmbeddedServer) -> dict[str, Any]:
    """The server's /varz (slow consumers, messages in and out)."""
    try:
        with urllib.request.urlopen(f"http://{srv.host}:{srv.monitor_port}/varz", timeout=5) as r:
            doc: dict[str, Any] = json.loads(r.read())
            return doc
    except (OSError, ValueError):
        return {}


async def _wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            got = await check()
            if got:
                return got
        await asyncio.sleep(0.5)
    raise RuntimeError(f"fleet scale: not reached within {timeout:.0f} s: {what}")


async def _leaders(store: kv.Store, shards: int, ctls: list[Controller]) -> dict[int, str | None] | None:
    for c in ctls:
        if not c.proc.alive:
            raise RuntimeError(f"{c.proc.name} exited ({c.proc.popen.returncode}); see {c.proc.log_path}")
    holders = await _lease_holders(store, shards)
    pids = {c.shard: set() for c in ctls}  # type: dict[int, set[int]]
    for c in ctls:
        pids[c.shard].add(c.pid)
    ok = all(_pid_of(holders[sh]) in pids[sh] for sh in range(shards))
    return holders if ok else None


async def _ready(c: Controller) -> bool:
    """/readyz answers 200 (connected, subscribed, rules loaded, tasks running) and a tick finished."""
    if not c.proc.alive:
        raise RuntimeError(f"{c.proc.name} exited ({c.proc.popen.returncode}); see {c.proc.log_path}")

    def get() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{c.port}/readyz", timeout=5) as r:
                if r.status != 200:
                    return False
        except urllib.error.HTTPError:
            return False
        return scrape(c.port).get("healer_controller_tick_seconds_count", 0) >= 1

    return await asyncio.to_thread(get)


def _report(
    args: argparse.Namespace,
    nodes: int,
    shard_nodes: dict[int, int],
    ctls: list[Controller],
    victim: Controller,
    standby: Controller,
    faults: list[Fault],
    kill_t: float | None,
    last_renewal_t: float | None,
    lease_moved_t: float | None,
    took_over_t: float | None,
    new_holder: str | None,
    t_window: float,
    t_end: float,
    srv_start: dict[str, ProcSample | None],
    srv_end: dict[str, ProcSample | None],
    varz: dict[str, dict[str, Any]],
    sim_start: dict[str, ProcSample | None],
    sim_end: dict[str, ProcSample | None],
    sim_stats: list[dict[str, Any]],
    final: dict[str, dict[str, float]],
    names_of: dict[int, list[str]],
) -> dict[str, Any]:
    shards = args.shards
    fleet_rate = nodes / args.interval
    per_shard: list[dict[str, Any]] = []
    for c in ctls:
        if c.start is None or c.end is None:
            continue
        share = c.nodes / nodes
        own = c.end_metrics.get("healer_controller_frames_ingested_total", 0) - c.start_metrics.get(
            "healer_controller_frames_ingested_total", 0
        )
        cpu = c.end.cpu_s - c.start.cpu_s
        span = c.end_at - c.start_at
        ticks = c.end_metrics.get("healer_controller_tick_seconds_count", 0) - c.start_metrics.get(
            "healer_controller_tick_seconds_count", 0
        )
        tick_s = c.end_metrics.get("healer_controller_tick_seconds_sum", 0) - c.start_metrics.get(
            "healer_controller_tick_seconds_sum", 0
        )
        fleet_frames = own / share if share else 0.0
        fpcs = fleet_frames / cpu if cpu > 0 else 0.0
        m = final.get(c.proc.name, c.end_metrics)
        per_shard.append(
            {
                "process": c.proc.name, "shard": c.shard, "pair": c.role, "pid": c.pid,
                "was": "leader, killed" if c is victim else ("standby, took over" if c is standby else
                       ("leader" if m.get("healer_controller_leader", 0) else "standby")),
                "shard_nodes": c.nodes, "window_s": round(span, 1), "cpu_s": round(cpu, 2),
                "share_of_a_core": round(cpu / span, 3) if span else None,
                "own_frames_ingested": int(own), "fleet_frames_received": int(fleet_frames),
                "fleet_frames_per_cpu_s": round(fpcs), "ticks": int(ticks),
                "tick_mean_ms": round(1000 * tick_s / ticks, 1) if ticks else None,
                "cores_at_1hz": round(nodes / fpcs, 3) if fpcs else None,
                "rss_idle_mib": round(c.rss_idle_mib, 1), "rss_mib": round(c.end.rss_mib, 1),
                "rss_peak_mib": round(c.end.hwm_mib, 1),
                "kib_per_node": round(1024 * c.end.rss_mib / c.nodes, 1) if c.nodes else None,
                "kib_per_node_above_idle": round(1024 * (c.end.rss_mib - c.rss_idle_mib) / c.nodes, 1)
                if c.nodes else None,
                "frames_dropped": int(m.get("healer_controller_frames_dropped_total", 0)),
                "frames_ingested_total": int(m.get("healer_controller_frames_ingested_total", 0)),
                "nats_disconnects": int(m.get("healer_controller_nats_disconnects_total", 0)),
            }
        )  # fmt: skip
    # frames end to end: what the publishers sent for each shard against what each surviving process of
    # the shard ingested (it ran from before the first frame to after the last)
    sent_for: dict[int, int] = {sh: 0 for sh in range(shards)}
    for p, st in enumerate(sim_stats):
        per_node = st.get("ticks", 0)
        for n in names_of[p]:
            sent_for[service.shard_of(n, shards)] += per_node
    lost = {
        r["process"]: sent_for[r["shard"]] - r["frames_ingested_total"]
        for r in per_shard
        if r["process"] != victim.proc.name
    }
    servers: list[dict[str, Any]] = []
    for name, a in srv_start.items():
        b = srv_end.get(name)
        if a is None or b is None:
            continue
        span = t_end - t_window
        servers.append(
            {
                "server": name, "cpu_s": round(b.cpu_s - a.cpu_s, 2),
                "share_of_a_core": round((b.cpu_s - a.cpu_s) / span, 3),
                "rss_mib": round(b.rss_mib, 1), "rss_peak_mib": round(b.hwm_mib, 1),
                "slow_consumers": int(varz.get(name, {}).get("slow_consumers", 0)),
                "in_msgs": int(varz.get(name, {}).get("in_msgs", 0)),
                "out_msgs": int(varz.get(name, {}).get("out_msgs", 0)),
            }
        )  # fmt: skip
    span = t_end - t_window
    frames_in_window = fleet_rate * span
    nats_cpu = sum(x["cpu_s"] for x in servers)
    sims_cpu = 0.0
    for k, v in sim_start.items():
        w = sim_end.get(k)
        if v is not None and w is not None:
            sims_cpu += w.cpu_s - v.cpu_s
    latencies = [f.acted_at - f.at for f in faults if f.acted_at is not None]
    steady = [f.acted_at - f.at for f in faults if f.acted_at is not None and not f.during_failover]
    p50, p99 = _quantiles(sorted(latencies))
    sp50, sp99 = _quantiles(sorted(steady))
    leaders = [r for r in per_shard if r["was"] in ("leader", "standby, took over")]
    fpcs_all = [r["fleet_frames_per_cpu_s"] for r in per_shard if r["fleet_frames_per_cpu_s"]]
    report = {
        "fleet": {
            "nodes": nodes,
            "gpus": nodes * 8,
            "shards": shards,
            "controllers": len(ctls),
            "publishers": len(names_of),
            "interval_s": args.interval,
            "fleet_frames_per_s": round(fleet_rate, 1),
            "rate_of_1hz": round(1 / args.interval, 4),
            "window_s": round(span, 1),
            "lease_ttl_s": args.lease_ttl,
            "nats_servers": 3,
        },
        "shards": per_shard,
        "fleet_frames_per_cpu_s_per_shard_process": {
            "min": min(fpcs_all) if fpcs_all else None,
            "max": max(fpcs_all) if fpcs_all else None,
        },
        "faults": {
            "injected": len(faults),
            "acted": len(latencies),
            "unacted": [f.node for f in faults if f.acted_at is None],
            "actions": sorted({f.action for f in faults if f.action}),
            "p50_s": p50,
            "p99_s": p99,
            "max_s": round(max(latencies), 3) if latencies else None,
            "outside_failover": {"faults": len(steady), "p50_s": sp50, "p99_s": sp99},
            "during_failover": [
                {"node": f.node, "latency_s": round(f.acted_at - f.at, 3) if f.acted_at else None}
                for f in faults
                if f.during_failover
            ],
        },
        "failover": {
            "killed": {"process": victim.proc.name, "pid": victim.pid},
            "standby": {"process": standby.proc.name, "pid": standby.pid, "holder": new_holder},
            "lease_taken_after_s": round(lease_moved_t - kill_t, 2) if lease_moved_t and kill_t else None,
            "took_over_after_s": round(took_over_t - kill_t, 2) if took_over_t and kill_t else None,
            "within_lease_ttl": bool(lease_moved_t and kill_t and lease_moved_t - kill_t <= args.lease_ttl),
            "last_renewal_before_kill_s": round(kill_t - last_renewal_t, 2)
            if kill_t and last_renewal_t
            else None,
            "lease_taken_after_lapse_s": round(lease_moved_t - (last_renewal_t + args.lease_ttl), 2)
            if lease_moved_t and last_renewal_t
            else None,
            "standby_attempt_every_s": round(args.lease_ttl / 5, 2),
            "standby_took_over": took_over_t is not None and new_holder is not None,
        },
        "frames": {
            "published": sum(int(st.get("frames", 0)) for st in sim_stats),
            "publisher_dropped": sum(int(st.get("frames_dropped", 0)) for st in sim_stats),
            "publisher_overruns": sum(int(st.get("overruns", 0)) for st in sim_stats),
            "controller_dropped": sum(r["frames_dropped"] for r in per_shard),
            "server_slow_consumers": sum(x["slow_consumers"] for x in servers),
            "controller_disconnects": sum(r["nats_disconnects"] for r in per_shard),
            "not_ingested_by_surviving_processes": lost,
        },
        "nats": {
            "servers": servers,
            "cpu_s": round(nats_cpu, 2),
            "cpu_ms_per_fleet_frame": round(1000 * nats_cpu / frames_in_window, 3)
            if frames_in_window
            else None,
            "cores_at_1hz": round(nats_cpu / frames_in_window * nodes, 2) if frames_in_window else None,
        },
        "publishers": {
            "cpu_s": round(sims_cpu, 2),
            "cpu_ms_per_frame": round(1000 * sims_cpu / frames_in_window, 3) if frames_in_window else None,
        },
        "at_1hz": {
            "cores_per_shard_process": round(nodes / min(fpcs_all), 3) if fpcs_all else None,
            "controller_cores": round(len(ctls) * nodes / min(fpcs_all), 2) if fpcs_all else None,
            "leader_rss_mib": max((r["rss_mib"] for r in leaders), default=None),
        },
    }
    return report


def _print(report: dict[str, Any]) -> None:
    f = report["fleet"]
    print(
        f"fleet scale: {f['nodes']:,} nodes x 8 GPUs ({f['gpus']:,} GPUs), one frame per node every "
        f"{f['interval_s']:g} s ({f['fleet_frames_per_s']:,} frames/s = {f['rate_of_1hz']:g} of 1 Hz), "
        f"{f['shards']} shards x 2 controllers, 3 NATS servers, {f['publishers']} `healer sim` publishers; "
        f"window {f['window_s']} s, lease TTL {f['lease_ttl_s']:g} s"
    )
    print("  process          role                shard nodes  CPU s  core   fleet fr/CPU s  tick ms"
          "  RSS MiB  KiB/node  dropped")  # fmt: skip
    for r in report["shards"]:
        print(
            f"  {r['process']:<16} {r['was']:<19} {r['shard_nodes']:>11,} {r['cpu_s']:>6.1f} "
            f"{r['share_of_a_core']:>5.2f} {r['fleet_frames_per_cpu_s']:>15,} {r['tick_mean_ms'] or 0:>8.1f}"
            f" {r['rss_mib']:>8.0f} {r['kib_per_node']:>9.1f} {r['frames_dropped']:>8,}"
        )
    fa = report["faults"]
    print(
        f"  faults: {fa['acted']}/{fa['injected']} acted on {fa['actions']}, fault-to-action p50 "
        f"{fa['p50_s']} s, p99 {fa['p99_s']} s (max {fa['max_s']} s); outside the failover: p50 "
        f"{fa['outside_failover']['p50_s']} s, p99 {fa['outside_failover']['p99_s']} s; during it: "
        f"{fa['during_failover']}"
    )
    fo = report["failover"]
    print(
        f"  failover: killed {fo['killed']['process']} (pid {fo['killed']['pid']}); "
        f"{fo['standby']['process']} took the lease after {fo['lease_taken_after_s']} s and took over "
        f"after {fo['took_over_after_s']} s (within the lease TTL: {fo['within_lease_ttl']}); the dead "
        f"leader had renewed {fo['last_renewal_before_kill_s']} s before the kill, so its key lapsed and "
        f"the standby took it {fo['lease_taken_after_lapse_s']} s later (it tries every "
        f"{fo['standby_attempt_every_s']} s)"
    )
    fr = report["frames"]
    print(
        f"  frames: {fr['published']:,} published, {fr['publisher_dropped']} dropped by the publishers, "
        f"{fr['controller_dropped']} by the controllers; {fr['server_slow_consumers']} slow-consumer cuts by "
        f"the servers ({fr['controller_disconnects']} controller disconnects); not ingested, per surviving "
        f"process: {fr['not_ingested_by_surviving_processes']}"
    )
    n = report["nats"]
    for srv in n["servers"]:
        print(
            f"  {srv['server']}: {srv['cpu_s']} s CPU ({srv['share_of_a_core']} of a core), RSS "
            f"{srv['rss_mib']} MiB (peak {srv['rss_peak_mib']} MiB), {srv['in_msgs']:,} messages in, "
            f"{srv['out_msgs']:,} out"
        )
    print(
        f"  NATS: {n['cpu_ms_per_fleet_frame']} ms CPU per fleet frame (3 servers together) -> "
        f"{n['cores_at_1hz']} cores at 1 Hz; publishers {report['publishers']['cpu_ms_per_frame']} ms a frame"
    )
    a = report["at_1hz"]
    print(
        f"  at 1 Hz (linear in frames): {a['cores_per_shard_process']} of a core per controller process, "
        f"{a['controller_cores']} cores for all {f['controllers']}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="benchmarks/fleet_scale.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--nodes", type=int, default=12_500, help="nodes of 8 GPUs (default %(default)s)")
    ap.add_argument(
        "--interval", type=float, default=20.0,
        help="seconds between a node's frames; 1 is the real rate (default %(default)s: 1/20 of it)",
    )  # fmt: skip
    ap.add_argument("--shards", type=int, default=4, help="controller shards, 2 processes each (%(default)s)")
    ap.add_argument("--publishers", type=int, default=4, help="`healer sim` processes (%(default)s)")
    ap.add_argument(
        "--duration", type=float, default=60.0,
        help="seconds of the measured window, after every node was seen (default %(default)s)",
    )  # fmt: skip
    ap.add_argument("--faults", type=int, default=24, help="fatal XIDs injected in the window (%(default)s)")
    ap.add_argument(
        "--kill-at", type=float, default=0.4,
        help="when shard 0's leader is killed, as a fraction of the window (default %(default)s)",
    )  # fmt: skip
    ap.add_argument("--lease-ttl", type=float, default=10.0, help="nats.lease_ttl_s (default %(default)s)")
    ap.add_argument(
        "--frame-arrivals-s",
        type=float,
        default=config.ControllerSettings().frame_arrivals_s,
        help="controller.frame_arrivals_s (0: frames read at ticks only; default %(default)s)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, configs)")
    ap.add_argument("--json", action="store_true", help="print the report as one JSON document")
    args = ap.parse_args()
    if args.shards < 1 or args.nodes < args.shards or args.faults < 1:
        ap.error("need --shards >= 1, --nodes >= --shards and --faults >= 1")
    report = asyncio.run(run(args))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    ok = not report["faults"]["unacted"] and report["failover"]["standby_took_over"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
