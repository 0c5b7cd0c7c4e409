"""Flood: one controller on a real nats-server while another process floods a telemetry subject with
malformed messages, as the chaos run did. Reports, from one run:

- messages offered per second (what the flooder got out) and what became of them: decoded and counted
  as bad, dropped by the controller's bounded backlog (``_frames_dropped_total``), dropped by the
  server for a slow consumer (``/varz`` ``slow_consumers``, and the controller's disconnects per
  connection);
- whether the lease was held throughout (the share of 50 ms samples where ``Controller.leader`` held,
  and how many times the lease was lost);
- XID-to-incident latency for one XID per second published during the flood;
- how many ``controller.bad_frame`` log lines the flood cost.

    .venv/bin/python benchmarks/flood.py [--seconds 10] [--lease-ttl 4]
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
from healer.controller import service
from healer.schemas import codec, events

XID_RULE = """
rules:
  - id: xid-fatal
    description: fatal XID
    on_event: {kind: xid, xid: [79]}
    severity: critical
    actions: [notify]
    resolve: {for: 1h}
"""


async def flooder(url: str, seconds: float) -> None:
    """The flooding process: malformed messages on one telemetry subject, as fast as it can."""
    bus = await natsbus.NatsBus.connect(url, name="flooder")
    subject = subjects.Subjects().telemetry("flood-node")
    sent = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _ in range(1000):
            await bus.publish(subject, b"{not json")
        sent += 1000
        await asyncio.sleep(0)
    await bus.flush(timeout=30)
    await bus.close()
    print(json.dumps({"sent": sent}))


def varz(srv: embedded.EmbeddedServer) -> dict[str, object]:
    with urllib.request.urlopen(f"http://{srv.host}:{srv.monitor_port}/varz", timeout=5) as r:
        return dict(json.loads(r.read()))


async def run(seconds: float, lease_ttl_s: float) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # errors only
    with tempfile.TemporaryDirectory() as tmp:
        srv = embedded.EmbeddedServer(pathlib.Path(tmp) / "nats")
        srv.start()
        try:
            await measure(srv, pathlib.Path(tmp), seconds, lease_ttl_s)
        finally:
            srv.stop()


async def measure(
    srv: embedded.EmbeddedServer, tmp: pathlib.Path, seconds: float, lease_ttl_s: float
) -> None:
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
            rules_dir=str(rules), mode="enforce", tick_s=0.5, metrics_port=0
        ),
    )
    ctl_bus = await natsbus.NatsBus.connect(srv.url, name="controller")
    ctl = await service.build(settings, ctl_bus, scheduler=testing.RecordingActuator())
    await ctl.start()
    while not ctl.leader:  # noqa: ASYNC110 - polling the controller's state is the point
        await asyncio.sleep(0.05)
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, read after it exits
        [sys.executable, __file__, "--flooder", srv.url, "--seconds", str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    samples: list[bool] = []
    published: dict[str, float] = {}
    tokens = {ctl.lease.token}
    started = time.monotonic()
    next_xid = started + 0.5
    while proc.poll() is None:
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
    out, _ = proc.communicate()
    sent = int(json.loads(out.strip().splitlines()[-1])["sent"])
    wall = time.monotonic() - started
    deadline = time.monotonic() + 30
    while set(published) - set(opened) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.1)

    def decoded_bad() -> float:
        samples = next(iter(ctl.metrics.decode_errors.collect())).samples
        return sum(s.value for s in samples if s.name.endswith("_total"))

    accounted = -1.0  # wait for the backlog (client queue, socket, server buffers) to drain
    while decoded_bad() + ctl.ingest.frames_sub.dropped != accounted and time.monotonic() < deadline:
        accounted = decoded_bad() + ctl.ingest.frames_sub.dropped
        await asyncio.sleep(1.0)
    decode_errors = decoded_bad()
    dropped = ctl.ingest.frames_sub.dropped  # all of them (the metric folds them in once per tick)
    disconnects = {c: ctl.metrics.nats_disconnects.labels(c)._value.get() for c in ("main", "telemetry")}
    latencies = [opened[n] - t for n, t in published.items() if n in opened]
    server_slow = varz(srv).get("slow_consumers")
    await ctl.stop()
    await ctl_bus.close()
    await bus.close()
    rows = [
        ("flood length (s)", f"{wall:.1f}"),
        ("messages offered", f"{sent:,} ({sent / wall:,.0f}/s)"),
        ("decoded and counted bad", f"{decode_errors:,.0f} ({decode_errors / max(sent, 1):.1%})"),
        ("dropped by the controller's backlog", f"{dropped:,.0f} ({dropped / max(sent, 1):.1%})"),
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
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--lease-ttl", type=float, default=4.0)
    parser.add_argument("--flooder", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flooder:
        asyncio.run(flooder(args.flooder, args.seconds))
    else:
        asyncio.run(run(args.seconds, args.lease_ttl))


if __name__ == "__main__":
    main()
