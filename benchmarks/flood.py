"""Flood: one controller on a real nats-server while another process floods a telemetry subject with
malformed messages, as the chaos run did. Reports, from one run:

- messages offered per second (what the flooder got out) and what became of them: decoded and counted
  as bad, dropped by the controller's bounded backlog (``_frames_dropped_total``), dropped by the
  server for a slow consumer (``/varz`` ``slow_consumers``, and the controller's disconnects per
  connection);
- whether the lease was held throughout (the share of 50 ms samples where ``Controller.leader`` held,
  and how many times the lease was lost);
- XID-to-incident latency for one XID per second published during the flood;
- how many ``controller.bad_frame`` log lines the flood cost;
- fairness: a third process publishes ``--nodes`` real 8-GPU nodes at 1 frame/s each before, during and
  after the flood; the share of their frames the controller ingested during the flood (against their
  rate before it), how long after the flood the backlog took to drain, and the controller's RSS growth;
- whether the last ``controller.frames_dropped`` and ``controller.bad_frame`` lines carry the totals the
  metrics count.

It ends with what holds (``holds`` / ``FAILS`` per figure, exit 1 if one fails): real nodes' frames at
90 % of their rate or more during the flood, the backlog drained within 5 s, RSS grown by at most
64 MiB, the lease never lost, and the log's totals equal to the metrics'. The figures go to
docs/performance.md.

    .venv/bin/python benchmarks/flood.py [--seconds 10] [--lease-ttl 4] [--nodes 50] [--rate 80000]
        [--own-subject] [--flooders 2]

``--own-subject`` floods the real nodes' own subjects with ``{"schema":"healer.telemetry.v1","node":1}``
(it passes the cheap precheck; the strict vet drops it once a node's queue is full); ``--rate 0`` with
``--flooders 2`` offers what two processes can, past what the controller can read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import structlog

from healer import config, testing
from healer.bus import base, embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.controller.core import service
from healer.schemas import codec, events, telemetry
from healer.sim import node_source

XID_RULE = """
rules:
  - id: xid-fatal
    description: fatal XID
    on_event: {kind: xid, xid: [79]}
    severity: critical
    actions: [notify]
    resolve: {for: 1h}
"""


OWN_GARBAGE = b'{"schema":"healer.telemetry.v1","node":1}'
"""What the chaos run sent on the real nodes' own subjects: it passes the cheap precheck."""


async def flooder(url: str, seconds: float, rate: float = 0.0, own_nodes: int = 0) -> None:
    """The flooding process: malformed messages at ``rate`` per second (0: as fast as it can), on one
    telemetry subject of its own, or (``own_nodes``) round-robin on the real nodes' own subjects."""
    bus = await natsbus.NatsBus.connect(url, name="flooder")
    subj = subjects.Subjects()
    targets = [subj.telemetry(f"real-{i:03d}") for i in range(own_nodes)] or [subj.telemetry("flood-node")]
    payload = OWN_GARBAGE if own_nodes else b"{not json"
    sent = 0
    start = time.monotonic()
    deadline = start + seconds
    while time.monotonic() < deadline:
        for i in range(1000):
            await bus.publish(targets[i % len(targets)], payload)
        sent += 1000
        ahead = sent / rate - (time.monotonic() - start) if rate else 0.0
        await asyncio.sleep(max(0.0, ahead))
    await bus.flush(timeout=30)
    await bus.close()
    print(json.dumps({"sent": sent}))


async def publisher(url: str, nodes: int, seconds: float) -> None:
    """Real nodes: ``nodes`` 8-GPU frames per second (one per node), for ``seconds``."""
    bus = await natsbus.NatsBus.connect(url, name="nodes")
    sources = [node_source.SimSource(f"real-{i:03d}", gpus=8, seed=i) for i in range(nodes)]
    sent = 0
    deadline = time.monotonic() + seconds
    next_t = time.monotonic()
    seq = 0
    while time.monotonic() < deadline:
        seq += 1
        for src in sources:
            frame = telemetry.NodeFrame(
                node=src.node, ts=time.time(), seq=seq, boot_id="b", agent_version="bench", source="sim",
                gpus_expected=8, gpus=src.sample().gpus,
            )  # fmt: skip
            await bus.publish(subjects.Subjects().telemetry(src.node), codec.encode(frame))
            sent += 1
        next_t += 1.0
        await asyncio.sleep(max(0.0, next_t - time.monotonic()))
    await bus.flush(timeout=30)
    await bus.close()
    print(json.dumps({"sent": sent}))


def rss_mib() -> float:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def varz(srv: embedded.EmbeddedServer) -> dict[str, object]:
    with urllib.request.urlopen(f"http://{srv.host}:{srv.monitor_port}/varz", timeout=5) as r:
        return dict(json.loads(r.read()))


LOGGED: list[dict[str, object]] = []


def _record(_: object, __: str, event: dict[str, object]) -> dict[str, object]:
    """Keep the drop and bad-frame lines (to compare with the metrics); print nothing."""
    if event.get("event") in ("controller.frames_dropped", "controller.bad_frame"):
        LOGGED.append(dict(event))
    raise structlog.DropEvent


async def run(seconds: float, lease_ttl_s: float, nodes: int, rate: float, own: bool, flooders: int) -> int:
    structlog.configure(processors=[_record], wrapper_class=structlog.make_filtering_bound_logger(30))
    with tempfile.TemporaryDirectory() as tmp:
        srv = embedded.EmbeddedServer(pathlib.Path(tmp) / "nats")
        srv.start()
        try:
            return await measure(srv, pathlib.Path(tmp), seconds, lease_ttl_s, nodes, rate, own, flooders)
        finally:
            srv.stop()


async def measure(
    srv: embedded.EmbeddedServer,
    tmp: pathlib.Path,
    seconds: float,
    lease_ttl_s: float,
    nodes: int,
    rate: float,
    own: bool = False,
    flooders: int = 1,
) -> int:
    rules = tmp / "rules"
    rules.mkdir()
    (rules / "xid.yaml").write_text(XID_RULE)
    subj = subjects.Subjects()
    bus = await natsbus.NatsBus.connect(srv.url, name="bench")
    await provision.ensure(bus, subj, config.NatsSettings(lease_ttl_s=lease_ttl_s))
    opened: dict[str, float] = {}

    async def on_incident(msg: base.Msg) -> None:
        if ".opened." in msg.subject:
            opened.setdefault(codec.decode_incident(msg.data).data.node, time.monotonic())

    await bus.subscribe(subj.all_incidents, on_incident)
    settings = config.Settings(
        nats=config.NatsSettings(url=srv.url, lease_ttl_s=lease_ttl_s),
        controller=config.ControllerSettings(
            rules_dir=str(rules), mode="enforce", tick_s=0.5, metrics_port=0, admission="first-seen"
        ),
    )
    ctl_bus = await natsbus.NatsBus.connect(srv.url, name="controller")
    ctl = await service.build(settings, ctl_bus, scheduler=testing.RecordingActuator())
    await ctl.start()
    while not ctl.leader:  # noqa: ASYNC110 - polling the controller's state is the point
        await asyncio.sleep(0.05)
    before_s, after_s = 5.0, 8.0
    real = subprocess.Popen(  # noqa: ASYNC220 - started once, read after it exits
        [sys.executable, __file__, "--publisher", srv.url, "--nodes", str(nodes),
         "--seconds", str(before_s + seconds + after_s)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip

    def frames() -> float:
        return ctl.metrics.registry.get_sample_value("healer_controller_frames_ingested_total") or 0.0

    while frames() == 0.0 and real.poll() is None:  # noqa: ASYNC110 - the publisher is up (slow on a loaded machine)
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # a whole round in
    base0, t0 = frames(), time.monotonic()
    await asyncio.sleep(before_s - 1.0)
    baseline_rate = (frames() - base0) / (time.monotonic() - t0)
    rss0 = rss_mib()
    rss_max = rss0
    command = [
        sys.executable, __file__, "--flooder", srv.url, "--seconds", str(seconds),
        "--rate", str(rate / flooders), "--own-nodes", str(nodes if own else 0),
    ]  # fmt: skip
    procs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, text=True)  # noqa: ASYNC220 - read after it exits
        for _ in range(flooders)
    ]
    samples: list[bool] = []
    published: dict[str, float] = {}
    tokens = {ctl.lease.token}
    started = time.monotonic()
    next_xid = started + 0.5
    flood0 = frames()
    while any(p.poll() is None for p in procs):
        rss_max = max(rss_max, rss_mib())
        samples.append(ctl.leader)
        tokens.add(ctl.lease.token)
        now = time.monotonic()
        if now >= next_xid and now - started < seconds:
            node = f"x{len(published)}"
            event = events.new(node, "xid", gpu_index=0, xid=79)
            await bus.publish_durable(subj.events(node), codec.encode(event), msg_id=event.id)
            published[node] = time.monotonic()
            next_xid += 1.0
        await asyncio.sleep(0.05)
    sent = 0
    for p in procs:
        out, _ = p.communicate()
        sent += int(json.loads(out.strip().splitlines()[-1])["sent"])
    wall = time.monotonic() - started
    flood_rate = (frames() - flood0) / wall
    flood_end = time.monotonic()
    deadline = time.monotonic() + 30
    while set(published) - set(opened) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.1)

    def decoded_bad() -> float:
        samples = next(iter(ctl.metrics.decode_errors.collect())).samples
        return sum(s.value for s in samples if s.name.endswith("_total"))

    def accounted_now() -> float:
        return decoded_bad() + ctl.ingest.frames_sub.dropped

    accounted, changed_at = accounted_now(), time.monotonic()
    while time.monotonic() - changed_at < 2.0 and time.monotonic() < deadline:
        # the backlog (client queue, socket, server buffers) drains: counts move until it is empty
        rss_max = max(rss_max, rss_mib())
        await asyncio.sleep(0.05)
        if accounted_now() != accounted or ctl.ingest.frames_sub.pending:
            accounted, changed_at = accounted_now(), time.monotonic()
    drain_s = max(0.0, changed_at - flood_end)
    real_out, _ = real.communicate()
    real_sent = int(json.loads(real_out.strip().splitlines()[-1])["sent"])
    give_up = time.monotonic() + 15  # the last lines of the burst come at most one interval later
    while True:
        drops_lines = [e for e in LOGGED if e["event"] == "controller.frames_dropped"]
        bad_lines = [e for e in LOGGED if e["event"] == "controller.bad_frame"]
        metric_dropped = (
            ctl.metrics.registry.get_sample_value("healer_controller_frames_dropped_total") or 0.0
        )
        logged_dropped = drops_lines[-1]["dropped_total"] if drops_lines else 0
        logged_bad = sum(bad_lines[-1].get("total", {}).values()) if bad_lines else 0  # type: ignore[attr-defined]
        if (logged_dropped == metric_dropped and logged_bad == decoded_bad()) or time.monotonic() > give_up:
            break
        await asyncio.sleep(0.5)
    decode_errors = decoded_bad()
    dropped = ctl.ingest.frames_sub.dropped
    lost = "healer_controller_nats_disconnects_total"
    disconnects = {
        c: ctl.metrics.registry.get_sample_value(lost, {"connection": c}) for c in ("main", "telemetry")
    }
    latencies = [opened[n] - t for n, t in published.items() if n in opened]
    server_slow = varz(srv).get("slow_consumers")
    await ctl.stop()
    await ctl_bus.close()
    await bus.close()
    rows = [
        (
            "flood",
            f"{'the real nodes own subjects' if own else 'a subject of its own'}, {flooders} process(es)",
        ),
        ("flood length (s)", f"{wall:.1f}"),
        ("messages offered", f"{sent:,} ({sent / wall:,.0f}/s)"),
        ("decoded and counted bad", f"{decode_errors:,.0f} ({decode_errors / max(sent, 1):.1%})"),
        ("dropped by the fair backlog (the flood's own)", f"{dropped:,.0f} ({dropped / max(sent, 1):.1%})"),
        ("lost elsewhere (server slow consumer)", f"{max(0, sent - decode_errors - dropped):,.0f}"),
        ("server slow_consumers (/varz)", str(server_slow)),
        (
            "controller disconnects main / telemetry",
            f"{disconnects['main']:.0f} / {disconnects['telemetry']:.0f}",
        ),
        ("lease held (share of 50 ms samples)", f"{sum(samples) / max(len(samples), 1):.1%}"),
        ("lease tokens seen (1 = never lost)", str(len(tokens - {None}))),
        ("XIDs acted on during the flood", f"{len(latencies)} of {len(published)}"),
        (
            "XID-to-incident latency median / max (s)",
            f"{statistics.median(latencies):.2f} / {max(latencies):.2f}" if latencies else "none",
        ),
    ]
    share = flood_rate / baseline_rate if baseline_rate else 0.0
    rows += [
        (
            "real nodes, frames/s before / during the flood",
            f"{baseline_rate:.1f} / {flood_rate:.1f} ({nodes} nodes at 1/s, {real_sent:,} sent)",
        ),
        ("real frames per node per second during the flood", f"{flood_rate / max(nodes, 1):.2f} (of 1.00)"),
        ("backlog drained after the flood (s)", f"{drain_s:.1f}"),
        ("controller RSS before / peak (MiB)", f"{rss0:.0f} / {rss_max:.0f}"),
        ("frames dropped: last log line / metric", f"{logged_dropped:,} / {metric_dropped:,.0f}"),
        ("bad frames: last log line total / metric", f"{logged_bad:,} / {decode_errors:,.0f}"),
        ("log lines (frames_dropped, bad_frame)", f"{len(drops_lines)}, {len(bad_lines)}"),
    ]
    checks = [
        ("real nodes keep >= 90 % of their frame rate during the flood", share >= 0.9),
        ("the backlog drains within 5 s of the flood's end", drain_s <= 5.0),
        ("RSS grows by at most 64 MiB", rss_max - rss0 <= 64.0),
        ("the lease is never lost", len(tokens - {None}) == 1),
        (
            "log lines report the metrics' totals",
            logged_dropped == metric_dropped and logged_bad == decode_errors,
        ),
    ]
    width = max(len(k) for k, _ in rows + checks)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    for k, ok in checks:
        print(f"{k:<{width}}  {'holds' if ok else 'FAILS'}")
    return 0 if all(ok for _, ok in checks) else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--lease-ttl", type=float, default=4.0)
    parser.add_argument("--nodes", type=int, default=50, help="real nodes publishing beside the flood")
    parser.add_argument(
        "--rate", type=float, default=80_000, help="flood messages per second (the chaos run's; 0: flat out)"
    )
    parser.add_argument(
        "--own-subject",
        action="store_true",
        help="flood the real nodes' own subjects with frame-like garbage",
    )
    parser.add_argument("--flooders", type=int, default=1, help="flooding processes (for rates past one's)")
    parser.add_argument("--own-nodes", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--flooder", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--publisher", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flooder or args.publisher:  # children: their stdout is the count, nothing else
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(50))
    if args.flooder:
        asyncio.run(flooder(args.flooder, args.seconds, args.rate, args.own_nodes))
    elif args.publisher:
        asyncio.run(publisher(args.publisher, args.nodes, args.seconds))
    else:
        sys.exit(
            asyncio.run(
                run(
                    args.seconds,
                    args.lease_ttl,
                    args.nodes,
                    args.rate,
                    args.own_subject,
                    max(1, args.flooders),
                )
            )
        )


if __name__ == "__main__":
    main()
