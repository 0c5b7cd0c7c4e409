"""Replay: republish a recording's frames and events on a bus, at recorded pace or faster.

Frames go out as NodeFrames with ``source: replay`` (core publish, as an agent would), events with
JetStream and their original ids (so replaying the same file twice within the dedup window stores each
event once). By default timestamps are shifted so the recording starts now, which keeps time windows in
rules meaningful; ``rebase=False`` keeps the recorded times. ``speed`` is simulated seconds per wall
second; 0 publishes as fast as the bus takes it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import structlog

from healer import errors
from healer.bus import base, subjects
from healer.sim import frames, recording

log = structlog.get_logger(__name__)


@dataclasses.dataclass
class Stats:
    steps: int = 0
    frames: int = 0
    events: int = 0
    events_failed: int = 0


async def replay(
    rec: recording.Recording,
    bus: base.Bus,
    subj: subjects.Subjects,
    *,
    speed: float = 1.0,
    rebase: bool = True,
    clock: Callable[[], float] = time.time,
    stop: asyncio.Event | None = None,
) -> Stats:
    stats = Stats()
    names = rec.node_names
    telemetry_subjects = [subj.telemetry(n) for n in names]
    start_ts = float(rec.meta["start_ts"])
    offset = clock() - start_ts if rebase else 0.0
    encoder = frames.Encoder(
        names,
        rec.meta["static"],
        source="replay",
        agent_version=rec.meta["agent_version"],
        job_prefix=rec.meta["run_id"],
    )
    evts = sorted(rec.events(), key=lambda e: e["ts"])
    next_event = 0
    loop = asyncio.get_running_loop()
    wall0 = loop.time()

    async def publish_event(e: dict[str, Any]) -> None:
        doc = dict(e, ts=round(e["ts"] + offset, 3))
        try:
            await bus.publish_durable(subj.events(e["node"]), frames.encode_event(doc), e["id"])
            stats.events += 1
        except errors.HealerError as err:
            stats.events_failed += 1
            log.warning("replay.event_failed", event_id=e["id"], error=str(err))

    for step in rec.steps():
        if stop is not None and stop.is_set():
            break
        if speed > 0:
            delay = wall0 + (step.ts - start_ts) / speed - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        while next_event < len(evts) and evts[next_event]["ts"] <= step.ts:
            await publish_event(evts[next_event])
            next_event += 1
        ts = step.ts + offset
        for node, data in encoder.encode(step.columns, step.nodes, step.seq, step.boot_ids, ts):
            await bus.publish(telemetry_subjects[node], data)
            stats.frames += 1
        stats.steps += 1
    for e in evts[next_event:]:
        if stop is not None and stop.is_set():
            break
        await publish_event(e)
    await bus.flush()
    log.info("replay.done", **dataclasses.asdict(stats))
    return stats
