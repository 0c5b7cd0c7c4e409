"""A node's own frames get through any flood on its own subject (#38): garbage that names the node's
subject (``{"schema": "healer.telemetry.v1", "node": 1}`` passes the cheap precheck) is vetted by the
strict decoder once the node's queue is full, and dropped there, so it never pushes a real frame out.
A real nats-server, the real controller, a flooder on its own connection."""

from __future__ import annotations

import asyncio

import pytest

from healer import testing
from healer.bus import nats as natsbus
from healer.bus import subjects
from tests.controller.conftest import Fleet, Harness, metric, run_until

pytestmark = pytest.mark.nats

GARBAGE = (
    b'{"schema":"healer.telemetry.v1","node":1}',  # a non-string node
    b'{"schema":"healer.telemetry.v1","node":"n1"}',  # the right node, nothing else
    b'{"schema":"healer.telemetry.v1","node":"n2","ts":1,"seq":1}',  # another node's name
)


async def flood(url: str, subject: str, stop: asyncio.Event) -> int:
    bus = await natsbus.NatsBus.connect(url, name="flooder")
    sent = 0
    try:
        while not stop.is_set():  # bursts of 500 (the controller shares this event loop)
            for i in range(500):
                await bus.publish(subject, GARBAGE[i % len(GARBAGE)])
            sent += 500
            await asyncio.sleep(0.01)
        await bus.flush(10)
    finally:
        await bus.close()
    return sent


async def test_garbage_on_a_nodes_own_subject_never_crowds_out_its_real_frames(harness: Harness) -> None:
    ctl = await harness.controller(testing.RecordingActuator())
    fleet = Fleet(harness.bus, ["n1"])
    await run_until(fleet, lambda: ctl.leader)
    before = metric(ctl.metrics, "frames_ingested_total")
    stop = asyncio.Event()
    flooder = asyncio.create_task(flood(harness.srv.url, subjects.Subjects().telemetry("n1"), stop))
    rounds = 40
    try:
        for _ in range(rounds):  # n1's agent: a frame every 0.1 s, under the flood
            await fleet.publish()
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        sent = await flooder
    await harness.bus.flush()
    await asyncio.sleep(1.0)  # what is still queued is handled
    real = metric(ctl.metrics, "frames_ingested_total") - before
    assert sent >= 100 * rounds, "the flood outnumbered the real frames a hundred times over"
    assert real >= 0.9 * rounds, f"{real:.0f} of {rounds} real frames ingested under the flood"
    bad = sum(
        metric(ctl.metrics, "decode_errors_total", kind="frame", reason=r) for r in ("json", "validation")
    )
    mismatched = metric(ctl.metrics, "messages_rejected_total", kind="frame", reason="identity_mismatch")
    assert bad + mismatched > 0, "the garbage was counted"
