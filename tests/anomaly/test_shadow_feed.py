"""Shadow mode on the feed and on /metrics: a pool not calibrated yet publishes its would-be incidents
as their own CloudEvent type (never an incident, never sent to Alertmanager), and every pool's state,
rate and thresholds are on /metrics."""

from __future__ import annotations

import asyncio
import pathlib
from datetime import UTC, datetime
from typing import cast

import prometheus_client as prom
import pytest
import structlog

from healer import config
from healer.bus import base, embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.controller.core import learning
from healer.controller.incidents import feed_publisher
from healer.controller.observability import metrics as controller_metrics
from healer.controller.store import kv
from healer.feed import alertmanager, envelope
from healer.schemas import codec, shadow

MODEL = pathlib.Path(__file__).resolve().parents[2] / "models" / "default"


def shadow_learning(overheat_lines: list[bytes]) -> tuple[learning.Learning, prom.CollectorRegistry]:
    """The controller's Learning with the default model, every pool in shadow, fed healer's overheat
    scenario (a node-wide inlet failure and cooling faults) and scored every 30 s."""
    registry = prom.CollectorRegistry()
    metrics = controller_metrics.ControllerMetrics(registry)
    cs = config.ControllerSettings.model_validate({"model": str(MODEL), "anomaly_interval_s": 30.0})
    anomaly = config.AnomalySettings.model_validate({"calibration_node_days": 1000.0})
    # the KV store is only read by restore/save, which this test does not call
    learn = learning.Learning(cs, cast(kv.Store, None), metrics, structlog.get_logger(), anomaly)
    scorer = learn.learning_scorer()
    assert scorer is not None
    next_at = None
    for data in overheat_lines:
        frame = codec.decode_frame_view(data)
        scorer.observe(frame, at=float(frame.ts))
        next_at = float(frame.ts) + 30.0 if next_at is None else next_at
        if frame.ts >= next_at:
            learn.score(float(frame.ts))
            next_at += 30.0
    return learn, registry


async def test_shadow_would_be_incidents_go_on_the_feed_as_their_own_type_and_never_to_alertmanager(
    overheat_lines: list[bytes], nats_server: embedded.EmbeddedServer
) -> None:
    learn, registry = shadow_learning(overheat_lines)
    events = learn.shadow_events("c1")
    assert events, "the overheat scenario's faults would have opened incidents"
    assert learn.shadow_events("c1") == []  # taken once
    for ev in events:
        assert ev.type == shadow.TYPE == "io.healer.anomaly.shadow.v1"
        assert ev.data.threshold > 0
        assert ev.data.value >= ev.data.threshold
        assert ev.data.node_days < ev.data.node_days_needed == 1000.0
        assert ev.data.pool.startswith("NVIDIA")
    # published through the incident feed's outbox, on its own subject in the incidents stream
    bus = await natsbus.NatsBus.connect(nats_server.url, name="shadow-test")
    try:
        subj = subjects.Subjects()
        await provision.ensure(bus, subj, config.NatsSettings())
        got: list[tuple[str, bytes]] = []
        all_in = asyncio.Event()

        async def on_msg(msg: base.Msg) -> None:
            got.append((msg.subject, msg.data))
            if len(got) >= len(events):
                all_in.set()

        await bus.subscribe(subj.all_incidents, on_msg)
        feed = feed_publisher.FeedPublisher(bus, subj, "c1")
        for ev in events:
            feed.enqueue_shadow(ev)
        await feed.flush()
        assert feed.published == len(events)  # stored in the incidents stream
        await asyncio.wait_for(all_in.wait(), 10)
    finally:
        await bus.close()
    assert [s for s, _ in got] == [subj.anomaly_shadow(ev.data.node) for ev in events]
    # a feed consumer passes it on as another CloudEvent: not an incident, nothing for Alertmanager
    book = alertmanager.AlertBook(resend_s=60.0)
    for _, data in got:
        item = envelope.classify(data)
        assert item.incident is None
        assert item.envelope.type == shadow.TYPE
        assert book.apply(item, datetime.now(UTC)) == []
    # counted per pool on /metrics, beside each pool's state, node-days and thresholds
    pools = {ev.data.pool for ev in events}
    total = sum(
        registry.get_sample_value("healer_controller_anomaly_shadow_incidents_total", {"pool": p}) or 0
        for p in pools
    )
    assert total == len(events)
    for p in pools:
        assert registry.get_sample_value("healer_controller_anomaly_pool_live", {"pool": p}) == 0
        days = registry.get_sample_value("healer_controller_anomaly_pool_node_days", {"pool": p})
        assert days is not None
        assert 0 < days < 1000
        thr = registry.get_sample_value(
            "healer_controller_anomaly_pool_threshold", {"pool": p, "component": "thermal_node"}
        )
        assert thr is not None
        assert thr >= 1.0
    # in shadow the pool's rate is its would-be one, per node-day watched (as of the last score)
    scorer = learn.learning_scorer()
    assert scorer is not None
    assert scorer.cfar is not None
    for st in scorer.cfar.status():
        rate = registry.get_sample_value(
            "healer_controller_anomaly_pool_incidents_per_1000_node_days", {"pool": st["pool"]}
        )
        assert rate == pytest.approx(1000 * st["shadow_incidents"] / st["node_days"])
    assert any(st["shadow_incidents"] for st in scorer.cfar.status())
