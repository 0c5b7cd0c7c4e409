"""``healer telemetry watch``: a live view of frames on the bus, and a consumer that cannot be crashed.

Every message on ``healer.telemetry.*`` is decoded at the edge; a bad one is counted by reason and
reported on stderr, and the watch goes on. ``--json`` prints each valid frame as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from healer import config, errors, logs
from healer.bus import base, subjects
from healer.cli import common
from healer.schemas import codec, telemetry


def register(sub: Any) -> None:
    p = sub.add_parser("telemetry", help="look at the telemetry stream")
    tsub = p.add_subparsers(dest="telemetry_command", metavar="ACTION")
    tsub.required = True
    w = tsub.add_parser("watch", help="print frames as they arrive", description=__doc__)
    common.add_nats_option(w)
    w.add_argument("--node", help="only this node")
    w.add_argument("--json", action="store_true", help="one JSON frame per line")
    w.add_argument("--count", type=int, default=0, help="stop after N valid frames (0: until Ctrl-C)")
    w.set_defaults(func=_watch)


def summarise(frame: telemetry.NodeFrame) -> str:
    gpus = frame.gpus
    temps = [g.temp_c for g in gpus if g.temp_c is not None]
    power = sum(g.power_w for g in gpus if g.power_w is not None)
    missing = (frame.gpus_expected or len(gpus)) - len(gpus)
    hot = max(temps) if temps else float("nan")
    line = f"{frame.node} seq={frame.seq} gpus={len(gpus)} max_temp={hot:.0f}C power={power:.0f}W"
    return line + (f" MISSING={missing}" if missing > 0 else "")


class Watcher:
    def __init__(self, node: str | None, as_json: bool, count: int) -> None:
        self.node = node
        self.as_json = as_json
        self.count = count
        self.stats = codec.DecodeStats()
        self.done = asyncio.Event()

    async def handle(self, msg: base.Msg) -> None:
        try:
            frame = codec.decode_frame(msg.data)
        except errors.DecodeError as e:
            self.stats.bad(e)
            print(f"rejected on {msg.subject}: {e}", file=sys.stderr)
            return
        self.stats.ok("frame")
        if self.node and frame.node != self.node:
            return
        print(codec.encode(frame).decode() if self.as_json else summarise(frame), flush=True)
        if self.count and self.stats.accepted["frame"] >= self.count:
            self.done.set()


async def watch(s: config.Settings, watcher: Watcher, stop: asyncio.Event) -> codec.DecodeStats:
    subj = subjects.Subjects(s.nats.prefix)
    bus = await common.until_stopped(common.connect(s, "healer-telemetry-watch"), stop)
    try:
        topic = subj.telemetry(watcher.node) if watcher.node else subj.all_telemetry
        await bus.subscribe(topic, watcher.handle)
        done = asyncio.ensure_future(watcher.done.wait())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({done, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            done.cancel()
            stopped.cancel()
    finally:
        await bus.close()
    return watcher.stats


def _watch(args: argparse.Namespace) -> int:
    s = common.settings(args)
    logs.configure("error")
    w = Watcher(args.node, args.json, args.count)
    common.run(lambda stop: watch(s, w, stop))
    stats = w.stats
    if stats.total_rejected:
        detail = ", ".join(f"{k}/{r}={n}" for (k, r), n in sorted(stats.rejected.items()))
        print(f"rejected {stats.total_rejected} messages ({detail})", file=sys.stderr)
    return 0
