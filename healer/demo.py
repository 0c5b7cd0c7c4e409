"""``healer demo``: everything on one machine, nothing installed by hand.

Starts an embedded nats-server (JetStream, temporary state), provisions healer's streams, runs a small
simulated fleet of real Agents (SimSource, 8 GPUs each) publishing real NodeFrames and events, and
shows what arrives on the bus. Along the way it exercises the node-side safety path as the controller
will: an XID is raised on one node (spooled, delivered once, stored), and a fenced power-limit command
caps one GPU, the next frames show it cooling, then a restore returns the limit the agent found.

The controller (rules, incidents, remediation) is not part of this build yet; when it lands, the demo
runs it here and the scripted steps become detections.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import tempfile
import time
import uuid
from collections.abc import Callable

from healer import config, errors
from healer.agent import runner
from healer.bus import base, provision, server, subjects
from healer.bus import nats as natsbus
from healer.schemas import codec, commands, events, telemetry
from healer.telemetry import sim


@dataclasses.dataclass
class Summary:
    nodes: int
    gpus: int
    duration_s: float
    frames: int = 0
    bad_frames: int = 0
    events: dict[str, int] = dataclasses.field(default_factory=dict)
    commands: list[dict[str, object]] = dataclasses.field(default_factory=list)
    capped_gpu_temp_c: list[float] = dataclasses.field(default_factory=list)


class Fleet:
    def __init__(self, bus: base.Bus, subj: subjects.Subjects, nodes: int, state_root: str) -> None:
        self.agents = [
            runner.Agent(
                node=f"gpu-{i:03d}",
                source=sim.SimSource(f"gpu-{i:03d}", gpus=8, seed=i),
                bus=bus,
                subjects=subj,
                state_dir=f"{state_root}/gpu-{i:03d}",
                interval_s=1.0,
                gpus_expected=8,
            )
            for i in range(nodes)
        ]
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.tasks = [asyncio.create_task(a.run(self.stop)) for a in self.agents]

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def run(*, nodes: int = 8, duration_s: float = 40.0, out: Callable[[str], None] = print) -> Summary:
    summary = Summary(nodes=nodes, gpus=nodes * 8, duration_s=duration_s)
    with (
        tempfile.TemporaryDirectory(prefix="healer-demo-") as tmp,
        server.EmbeddedServer(f"{tmp}/nats") as srv,
    ):
        out(f"nats-server with JetStream on {srv.url}")
        subj = subjects.Subjects()
        bus = await natsbus.NatsBus.connect(srv.url, name="healer-demo")
        await provision.ensure(bus, subj, config.NatsSettings())
        latest: dict[str, telemetry.NodeFrame] = {}

        async def on_frame(msg: base.Msg) -> None:
            try:
                frame = codec.decode_frame(msg.data)
            except errors.DecodeError:
                summary.bad_frames += 1
                return
            summary.frames += 1
            latest[frame.node] = frame

        async def on_event(msg: base.Msg) -> None:
            ev = codec.decode_event(msg.data)
            summary.events[ev.kind] = summary.events.get(ev.kind, 0) + 1
            if ev.kind == "xid":
                out(f"  event  {ev.node} gpu{ev.gpu_index} XID {ev.xid}: {ev.message}")

        await bus.subscribe(subj.all_telemetry, on_frame)
        await bus.subscribe(subj.all_events, on_event)
        fleet = Fleet(bus, subj, nodes, tmp)
        fleet.start()
        out(f"fleet: {nodes} simulated nodes x 8 GPUs, one frame per node per second")
        started = time.monotonic()
        token = 1
        try:
            script = {
                5: "xid",
                8: "cap",
                24: "restore",
            }
            done: set[int] = set()
            while (elapsed := time.monotonic() - started) < duration_s:
                await asyncio.sleep(1.0)
                for at, step in script.items():
                    if elapsed >= at and at not in done:
                        done.add(at)
                        if step == "xid":
                            agent = fleet.agents[min(1, nodes - 1)]
                            agent.emit(
                                events.new(agent.node, "xid", gpu_index=5, xid=79, message="simulated")
                            )
                        else:
                            token += 1
                            summary.commands.append(await _power(bus, subj, step, token, out))
                target = latest.get("gpu-000")
                capped = len(summary.commands) == 1
                if capped and target is not None and len(target.gpus) > 3:
                    summary.capped_gpu_temp_c.append(target.gpus[3].temp_c or 0.0)
                if int(elapsed) % 5 == 0:
                    out(_status(latest, summary))
        finally:
            await fleet.close()
            await bus.close()
    return summary


async def _power(
    bus: base.Bus, subj: subjects.Subjects, step: str, token: int, out: Callable[[str], None]
) -> dict[str, object]:
    now = time.time()
    cmd = commands.Command(
        id=f"demo-{uuid.uuid4().hex[:8]}",
        node="gpu-000",
        action="set_power_limit" if step == "cap" else "restore_power_limit",
        gpu_index=3,
        percent_of_default=50 if step == "cap" else None,
        fencing_token=token,
        issued_at=now,
        expires_at=now + 10,
        reason="demo",
    )
    reply = codec.decode_command_result((await bus.request(subj.command("gpu-000"), codec.encode(cmd))).data)
    change = reply.gpus[0] if reply.gpus else None
    out(
        f"  command {cmd.action} gpu-000/gpu3 -> {reply.status}"
        + (f" ({change.previous_w:g} W -> {change.applied_w:g} W)" if change and change.applied_w else "")
    )
    return {"action": cmd.action, "status": reply.status, "applied_w": change.applied_w if change else None}


def _status(latest: dict[str, telemetry.NodeFrame], summary: Summary) -> str:
    temps = [g.temp_c for f in latest.values() for g in f.gpus if g.temp_c is not None]
    hot = max(temps) if temps else float("nan")
    gpu3 = latest.get("gpu-000")
    focus = ""
    if gpu3 is not None and len(gpu3.gpus) > 3:
        g = gpu3.gpus[3]
        focus = f" | gpu-000/gpu3 {g.temp_c:.1f}C {g.power_w:.0f}W limit {g.power_limit_w:.0f}W"
    return f"frames={summary.frames} nodes={len(latest)} hottest={hot:.1f}C{focus}"


def main(duration_s: float, nodes: int, as_json: bool) -> int:
    lines: list[str] = []
    summary = asyncio.run(run(nodes=nodes, duration_s=duration_s, out=lines.append if as_json else print))
    if as_json:
        print(json.dumps(dataclasses.asdict(summary), indent=2))
    else:
        print(
            f"summary: {summary.frames} frames from {summary.nodes} nodes, {summary.bad_frames} rejected; "
            f"events {summary.events}; commands {[c['status'] for c in summary.commands]}"
        )
        if len(summary.capped_gpu_temp_c) > 1:
            t = summary.capped_gpu_temp_c
            print(f"gpu-000/gpu3 under the cap: {t[0]:.1f}C -> {min(t):.1f}C")
    return 0
