"""What ``healer alertmanager`` sends, decided without Alertmanager: ``AlertBook`` (pure) and the sink's
restart behaviour against a real nats-server with a recording POST."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from healer import errors
from healer.bus import nats as natsbus
from healer.feed import alertmanager, envelope, webhook
from healer.schemas import codec, incidents
from tests import conftest
from tests.feed import helpers
from tests.feed.test_forward import FAST

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def item(ev: incidents.IncidentEvent, seq: int) -> envelope.Item:
    return envelope.classify(codec.encode(ev), seq)


def change(ev: incidents.IncidentEvent, n: int, c: incidents.Change, **data: Any) -> incidents.IncidentEvent:
    return incidents.build(
        event_id=f"{ev.data.incident_id}.{n}",
        cluster="test",
        change=c,
        data=ev.data.model_copy(update=data),
        ts=ev.time.timestamp() + n,
    )


def test_an_open_incident_is_an_alert_that_ends_four_resends_ahead() -> None:
    book = alertmanager.AlertBook(resend_s=60)
    ev = helpers.event(1, gpu_index=None, severity="warning")
    [alert] = book.apply(item(ev, 1), NOW)
    assert alert["labels"] == {
        "alertname": "ecc-uncorrectable",
        "node": "gpu-node-1",
        "severity": "warning",
        "healer_severity": "warning",
        "cluster": "test",
    }, "a node-level incident has no gpu label"
    assert alert["endsAt"] == "2026-12-01T12:04:00Z"
    assert "generatorURL" not in alert
    assert book.open_alerts(NOW + timedelta(minutes=1))[0]["endsAt"] == "2026-12-01T12:05:00Z"


def test_resolve_sets_ends_at_and_leaves_nothing_to_resend() -> None:
    book = alertmanager.AlertBook(resend_s=60)
    ev = helpers.event(2)
    book.apply(item(ev, 1), NOW)
    resolved = change(ev, 2, incidents.Change.RESOLVED, state=incidents.IncidentState.RESOLVED)
    [alert] = book.apply(item(resolved, 2), NOW)
    assert datetime.fromisoformat(alert["endsAt"]) == resolved.time
    assert alert["startsAt"] == ev.time.isoformat().replace("+00:00", "Z")
    assert book.open_alerts(NOW) == []


def test_an_older_redelivered_event_does_not_reopen_a_resolved_incident() -> None:
    book = alertmanager.AlertBook(resend_s=60)
    ev = helpers.event(3)
    book.apply(item(ev, 1), NOW)
    book.apply(item(change(ev, 2, incidents.Change.RESOLVED, state=incidents.IncidentState.RESOLVED), 2), NOW)
    [again] = book.apply(item(ev, 1), NOW)
    assert again["annotations"]["state"] == "resolved"
    assert book.open_alerts(NOW) == []


def test_a_severity_change_ends_the_old_alert_and_starts_the_new_one() -> None:
    book = alertmanager.AlertBook(resend_s=60)
    ev = helpers.event(4, severity="warning")
    book.apply(item(ev, 1), NOW)
    old, new = book.apply(item(change(ev, 2, incidents.Change.UPDATED, severity="critical"), 2), NOW)
    assert (old["labels"]["severity"], old["endsAt"]) == ("warning", "2026-12-01T12:00:00Z")
    assert new["labels"]["severity"] == "critical"
    assert [a["labels"]["severity"] for a in book.open_alerts(NOW)] == ["critical"]


def test_other_events_are_not_alerts_and_the_link_is_quoted() -> None:
    book = alertmanager.AlertBook(resend_s=60, link_template="https://x.example/i/{incident_id}?r={rule_id}")
    rejected = envelope.classify(codec.encode(helpers.rules_rejected("rules-1")))
    assert book.apply(rejected, NOW) == []
    ev = change(helpers.event(5), 1, incidents.Change.OPENED, rule_id="a b&c")
    [alert] = book.apply(item(ev, 1), NOW)
    assert alert["generatorURL"] == "https://x.example/i/inc-5?r=a%20b%26c"
    assert alert["annotations"]["link"] == alert["generatorURL"]
    with pytest.raises(errors.PermanentError, match="bad alertmanager link"):
        alertmanager.check_link_template("https://x/{nope}")


def test_alerts_url_keeps_a_path_prefix() -> None:
    assert alertmanager.alerts_url("http://am:9093") == "http://am:9093/api/v2/alerts"
    assert alertmanager.alerts_url("https://h/alertmanager/") == "https://h/alertmanager/api/v2/alerts"
    with pytest.raises(errors.PermanentError):
        alertmanager.alerts_url("am:9093")


class Recorder:
    def __init__(self) -> None:
        self.posts: list[list[dict[str, Any]]] = []

    async def __call__(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float
    ) -> webhook.Delivery:
        assert url.endswith("/api/v2/alerts")
        self.posts.append(orjson.loads(body))
        return webhook.Delivery(status=200, elapsed_s=0.0)

    def incident_states(self) -> list[tuple[str, str]]:
        return [(a["annotations"]["incident_id"], a["annotations"]["state"]) for p in self.posts for a in p]


async def _run(bus: natsbus.NatsBus, rec: Recorder) -> tuple[asyncio.Event, asyncio.Task[None]]:
    settings = FAST.model_copy(update={"durable": "am-book", "alertmanager_resend_s": 3600.0})
    sink = alertmanager.AlertmanagerSink(bus, helpers.SUBJ, "http://127.0.0.1:9", settings, post=rec)
    stop = asyncio.Event()
    return stop, asyncio.create_task(sink.run(stop))


async def test_open_incidents_are_resent_after_a_restart_and_nothing_is_lost(
    nats_bus: natsbus.NatsBus,
) -> None:
    first = Recorder()
    stop, task = await _run(nats_bus, first)
    ev = helpers.event(6)
    await helpers.publish(
        nats_bus, ev
    )  # before or after the sink's start: the rebuild or the consumer has it
    await conftest.until(lambda: ("inc-6", "open") in first.incident_states())
    stop.set()
    await asyncio.wait_for(task, 10)

    # while stopped: the incident resolves, another opens
    await helpers.publish(
        nats_bus, change(ev, 2, incidents.Change.RESOLVED, state=incidents.IncidentState.RESOLVED)
    )
    other = helpers.event(7)
    await helpers.publish(nats_bus, other)

    second = Recorder()
    stop, task = await _run(nats_bus, second)
    await conftest.until(lambda: ("inc-6", "resolved") in second.incident_states())
    await conftest.until(lambda: ("inc-7", "open") in second.incident_states())
    stop.set()
    await asyncio.wait_for(task, 10)
    # the start-up resend already knew inc-7 is open and inc-6 is not (rebuilt from the stream)
    assert [(a["annotations"]["incident_id"]) for a in second.posts[0]] == ["inc-7"]


def test_cli_refuses_a_bad_url_or_link_template_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    from healer import cli

    assert cli.main(["alertmanager", "--nats", "nats://127.0.0.1:9", "--url", "am:9093"]) == 2
    assert "http:// or https://" in capsys.readouterr().err
    argv = [
        "alertmanager",
        "--nats",
        "nats://127.0.0.1:9",
        "--url",
        "http://am:9093",
        "--link",
        "https://x/{nope}",
    ]
    assert cli.main(argv) == 2
    assert "bad alertmanager link template" in capsys.readouterr().err


def test_the_same_event_again_gives_the_same_alerts_so_a_retry_repeats_the_ended_one() -> None:
    book = alertmanager.AlertBook(resend_s=60)
    ev = helpers.event(8, severity="warning")
    book.apply(item(ev, 1), NOW)
    updated = item(change(ev, 2, incidents.Change.UPDATED, severity="critical"), 2)
    first = book.apply(updated, NOW)
    later = NOW + timedelta(minutes=10)
    again = book.apply(updated, later)
    assert [a["labels"]["severity"] for a in again] == ["warning", "critical"]
    assert again[0] == first[0], "the ended alert keeps its endsAt"
    assert again[1]["endsAt"] == "2026-12-01T12:14:00Z", "the live one is fresh"


async def test_a_retried_alert_is_sent_with_a_fresh_ends_at(nats_bus: natsbus.NatsBus) -> None:
    clock = {"now": NOW}
    posts: list[list[dict[str, Any]]] = []

    async def flaky(url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> webhook.Delivery:
        posts.append(orjson.loads(body))
        if len(posts) == 1:
            clock["now"] = NOW + timedelta(minutes=10)  # Alertmanager was away for ten minutes
            raise errors.TemporaryError("down", delay=0.0)
        return webhook.Delivery(status=200, elapsed_s=0.0)

    settings = FAST.model_copy(update={"durable": "am-retry", "alertmanager_resend_s": 3600.0})
    sink = alertmanager.AlertmanagerSink(
        nats_bus, helpers.SUBJ, "http://127.0.0.1:9", settings, post=flaky, clock=lambda: clock["now"]
    )
    stop = asyncio.Event()
    task = asyncio.create_task(sink.run(stop))
    await conftest.until(lambda: sink.forwarder.consumer is not None)  # rebuilt, resent, now consuming
    await helpers.publish(nats_bus, helpers.event(9))
    await conftest.until(lambda: len(posts) >= 2)
    stop.set()
    await asyncio.wait_for(task, 10)
    assert [p[0]["endsAt"] for p in posts[:2]] == ["2026-12-01T16:00:00Z", "2026-12-01T16:10:00Z"]


def test_docs_list_every_label_and_annotation_the_alerts_carry() -> None:
    import pathlib

    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "alertmanager.md").read_text()
    book = alertmanager.AlertBook(resend_s=60, link_template="https://x/{node}")
    ev = helpers.event(
        10,
        mode=incidents.Mode.DRY_RUN,
        actions=[incidents.ActionRecord(kind="cordon", status="planned", at=1)],
    )
    [alert] = book.apply(item(ev, 1), NOW)
    for name in alert["labels"]:
        assert f"| label `{name}` |" in text, name
    for name in alert["annotations"]:
        assert f"annotation `{name}`" in text, name
    for level, mapped in incidents.SEVERITY_LEVELS.items():
        assert f"| `{level}` | `{mapped.alertmanager}` | `{mapped.pagerduty}` |" in text, level
