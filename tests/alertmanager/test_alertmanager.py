"""``healer alertmanager`` against a real Alertmanager (API v2) and a real nats-server.

An incident appears in ``GET /api/v2/alerts`` with the documented labels and annotations, is routed to the
webhook receiver, and resolves; a silence made through ``POST /api/v2/silences`` keeps it from being
delivered while an unsilenced one in the same group is.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from healer.bus import embedded
from healer.bus import nats as natsbus
from healer.feed import alertmanager
from healer.schemas import incidents
from tests.alertmanager.server import Alertmanager
from tests.feed import helpers
from tests.feed.test_forward import FAST

pytestmark = pytest.mark.alertmanager

SETTINGS = FAST.model_copy(
    update={
        "durable": "am-test",
        "alertmanager_resend_s": 30.0,
        "alertmanager_link": "https://grafana.example/d/gpu?var-node={node}&incident={incident_id}",
    }
)


def incident(
    n: int,
    rule: str,
    *,
    state: incidents.IncidentState = incidents.IncidentState.OPEN,
    severity: incidents.Severity = "major",
) -> incidents.IncidentEvent:
    ev = helpers.event(
        n,
        severity=severity,
        change=incidents.Change.RESOLVED if state == "resolved" else incidents.Change.OPENED,
    )
    data = ev.data.model_copy(update={"rule_id": rule, "state": state, "incident_id": f"inc-{rule}"})
    change: incidents.Change = incidents.Change.RESOLVED if state == "resolved" else incidents.Change.OPENED
    return incidents.build(
        event_id=f"{rule}.{n}", cluster="test", change=change, data=data, ts=ev.time.timestamp()
    )


async def until_async(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """Poll ``check`` in a thread (it does HTTP) until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await asyncio.to_thread(check)
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def find(am: Alertmanager, alertname: str) -> dict[str, Any] | None:
    return next((a for a in am.alerts() if a["labels"]["alertname"] == alertname), None)


@pytest.fixture
async def sink_for(
    nats_bus: natsbus.NatsBus,
) -> AsyncIterator[Callable[[str], alertmanager.AlertmanagerSink]]:
    running: list[tuple[asyncio.Event, asyncio.Task[None]]] = []

    def start(url: str) -> alertmanager.AlertmanagerSink:
        sink = alertmanager.AlertmanagerSink(nats_bus, helpers.SUBJ, url, SETTINGS, start="all")
        stop = asyncio.Event()
        running.append((stop, asyncio.create_task(sink.run(stop))))
        return sink

    try:
        yield start
    finally:
        for stop, task in running:
            stop.set()
            await asyncio.wait_for(task, 10)


async def test_an_incident_becomes_an_alert_that_is_routed_and_resolves(
    nats_bus: natsbus.NatsBus, real_alertmanager: Alertmanager, sink_for: Callable[[str], Any]
) -> None:
    opened = incident(1, "ecc-uncorrectable")
    await helpers.publish(nats_bus, opened)
    sink_for(real_alertmanager.url)

    alert = await until_async(
        lambda: find(real_alertmanager, "ecc-uncorrectable"), "the alert in Alertmanager"
    )
    assert alert["labels"] == {
        "alertname": "ecc-uncorrectable",
        "node": "gpu-node-1",
        "gpu": "3",
        "severity": "critical",
        "healer_severity": "major",
        "cluster": "test",
    }
    ann = alert["annotations"]
    assert ann["summary"] == opened.data.summary
    assert ann["incident_id"] == "inc-ecc-uncorrectable"
    assert ann["evidence"] == '{"ecc_dbe_volatile":1}'
    link = "https://grafana.example/d/gpu?var-node=gpu-node-1&incident=inc-ecc-uncorrectable"
    assert ann["link"] == link
    assert alert["generatorURL"] == link
    assert alert["status"]["state"] == "active"
    ends_at = datetime.fromisoformat(alert["endsAt"].replace("Z", "+00:00"))
    assert ends_at > datetime.now(tz=UTC) + timedelta(seconds=60), "endsAt is 4 resend intervals ahead"

    firing = ("firing", alert["labels"])
    await until_async(lambda: firing in real_alertmanager.webhook.notified(), "the firing notification")

    await helpers.publish(nats_bus, incident(2, "ecc-uncorrectable", state=incidents.IncidentState.RESOLVED))
    resolved = ("resolved", alert["labels"])
    await until_async(lambda: resolved in real_alertmanager.webhook.notified(), "the resolved notification")
    await until_async(
        lambda: find(real_alertmanager, "ecc-uncorrectable") is None, "the alert gone from the list"
    )


async def test_a_silenced_incident_is_not_delivered(
    nats_bus: natsbus.NatsBus, real_alertmanager: Alertmanager, sink_for: Callable[[str], Any]
) -> None:
    now = datetime.now(tz=UTC)
    created = real_alertmanager.post(
        "/api/v2/silences",
        {
            "matchers": [
                {"name": "alertname", "value": "nvlink-link-down", "isRegex": False, "isEqual": True}
            ],
            "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(hours=1)).isoformat(),
            "createdBy": "healer tests",
            "comment": "maintenance on the NVLink fabric",
        },
    )
    silence_id = created["silenceID"]
    sink_for(real_alertmanager.url)
    await helpers.publish(nats_bus, incident(1, "nvlink-link-down"))

    def suppressed() -> dict[str, Any] | None:
        alert = find(real_alertmanager, "nvlink-link-down")
        return alert if alert and alert["status"]["state"] == "suppressed" else None

    alert = await until_async(suppressed, "the alert, suppressed")
    assert alert["status"]["silencedBy"] == [silence_id]

    # An unsilenced incident in the same group (same cluster) is delivered; the silenced one with it is not.
    await helpers.publish(nats_bus, incident(2, "ecc-uncorrectable", severity="critical"))
    await until_async(
        lambda: any(
            lb["alertname"] == "ecc-uncorrectable" for _s, lb in real_alertmanager.webhook.notified()
        ),
        "the unsilenced alert's notification",
    )
    assert all(lb["alertname"] != "nvlink-link-down" for _s, lb in real_alertmanager.webhook.notified())


def test_the_binary_is_a_known_alertmanager(real_alertmanager: Alertmanager) -> None:
    assert real_alertmanager.version.startswith("alertmanager, version 0."), real_alertmanager.version
    status = real_alertmanager.get("/api/v2/status")
    assert status["versionInfo"]["version"]


async def test_the_command_sends_incidents_and_stops_cleanly_on_sigterm(
    nats_bus: natsbus.NatsBus, nats_server: embedded.EmbeddedServer, real_alertmanager: Alertmanager
) -> None:
    await helpers.publish(nats_bus, incident(1, "gpu-thermal-slowdown-sustained"))
    env = {**os.environ, "HEALER_FEED_FETCH_TIMEOUT_S": "0.5", "HEALER_LOG_FORMAT": "json"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "healer", "alertmanager",
        "--nats", nats_server.url, "--url", real_alertmanager.url, "--link", "https://grafana.example/d/gpu?var-node={node}",
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        alert = await until_async(
            lambda: find(real_alertmanager, "gpu-thermal-slowdown-sustained"), "the alert"
        )
        assert alert["generatorURL"] == "https://grafana.example/d/gpu?var-node=gpu-node-1"
        await helpers.publish(
            nats_bus, incident(2, "gpu-thermal-slowdown-sustained", state=incidents.IncidentState.RESOLVED)
        )
        await until_async(
            lambda: find(real_alertmanager, "gpu-thermal-slowdown-sustained") is None, "the alert resolved"
        )
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    info = await nats_bus.js.consumer_info(helpers.SUBJ.stream_incidents, alertmanager.DEFAULT_DURABLE)
    assert (info.num_pending, info.num_ack_pending) == (0, 0), "everything delivered was acknowledged"
