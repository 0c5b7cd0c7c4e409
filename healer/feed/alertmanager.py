"""The incident feed into Alertmanager's API v2 as alerts: ``healer alertmanager``.

Alertmanager is where routing, grouping, silences, inhibition and the PagerDuty/Slack/e-mail receivers
live, so healer hands it alerts rather than reimplementing them. One incident is one alert:

- labels (its identity): ``alertname`` = the rule id, ``node``, ``gpu`` (the NVML index; absent for a
  node-level incident), ``port`` (a port incident's RDMA port, ``mlx5_0/1``; absent otherwise),
  ``severity`` (Alertmanager's ``info | warning | critical``, from
  ``incidents.SEVERITY_LEVELS``), ``healer_severity`` (healer's own), ``cluster``;
- annotations: ``summary``, ``evidence`` (JSON), ``incident_id``, ``state``, ``actions``, ``mode`` when not
  ``enforce``, and ``link`` (also ``generatorURL``) when ``feed.alertmanager_link`` is set;
- ``startsAt`` the first event of the incident seen; ``endsAt`` the resolve time once resolved, else
  ``4 x feed.alertmanager_resend_s`` ahead, and every open alert is sent again each
  ``alertmanager_resend_s``, as Prometheus does: Alertmanager never resolves a live incident on its own,
  and resolves them all if healer stops sending.

Delivery is the forwarder's (``forward.Forwarder``): a durable JetStream consumer, one event in flight,
acknowledged after Alertmanager answered 2xx, retried while it is down. The set of open incidents to
resend is rebuilt at start by reading the stream (``tail.read``), so it survives restarts too. Events
other than incidents (``io.healer.rules.rejected.v1``, other types) are acknowledged without sending.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import urllib.parse
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

import orjson
import structlog

import healer
from healer import config, errors, tasks
from healer.bus import base, subjects
from healer.feed import envelope, forward, tail, webhook
from healer.schemas import incidents

log = structlog.get_logger(__name__)

ALERTS_PATH: Final = "/api/v2/alerts"
RESEND_FACTOR: Final = 4
"""``endsAt`` of an open alert is this many resend intervals ahead (Prometheus uses 4 too)."""
DEFAULT_DURABLE: Final = "healer-alertmanager"

Alert = dict[str, Any]


def alerts_url(base: str) -> str:
    """``http://am:9093`` (or ``.../alertmanager/`` behind a path prefix) → its ``/api/v2/alerts``."""
    forward.check_url(base)
    parts = urllib.parse.urlsplit(base)
    return urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/") + ALERTS_PATH))


def _rfc3339(ts: datetime) -> str:
    return ts.astimezone(UTC).isoformat().replace("+00:00", "Z")


def cluster_of(ev: incidents.IncidentEvent) -> str:
    """The ``cluster`` node label if the controller sent one, else the cluster in ``healer://<cluster>/...``."""
    if ev.data.labels.get("cluster"):
        return ev.data.labels["cluster"]
    parts = urllib.parse.urlsplit(ev.source)
    return parts.netloc if parts.scheme == "healer" and parts.netloc else ev.source


def labels_for(ev: incidents.IncidentEvent) -> dict[str, str]:
    d = ev.data
    labels = {
        "alertname": d.rule_id,
        "node": d.node,
        "severity": incidents.SEVERITY_LEVELS[d.severity].alertmanager,
        "healer_severity": d.severity,
        "cluster": cluster_of(ev),
    }
    if d.gpu_index is not None:
        labels["gpu"] = str(d.gpu_index)
    port = incidents.port_of(d)
    if port is not None:
        labels["port"] = port
    return labels


@dataclasses.dataclass
class _Tracked:
    stream_seq: int
    event: incidents.IncidentEvent
    starts_at: datetime
    labels: dict[str, str]
    retired: list[Alert] = dataclasses.field(default_factory=list)
    """Alerts the latest event ended (its labels changed), sent with it until a newer event comes."""


class AlertBook:
    """The latest event of every incident seen on the feed, and the alerts that say so.

    Pure: no I/O, time passed in. ``apply`` takes events in any order and redeliveries (an event older
    than the one already applied for its incident changes nothing) and returns the alerts to send now;
    applying the same event again gives the same alerts (with a fresh ``endsAt``), so a retry can ask again.
    """

    def __init__(self, resend_s: float, link_template: str | None = None) -> None:
        self.resend_s = resend_s
        self.link_template = link_template
        self._incidents: dict[str, _Tracked] = {}

    def apply(self, item: envelope.Item, now: datetime) -> list[Alert]:
        ev = item.incident
        if ev is None:
            return []
        key = ev.data.incident_id
        tracked = self._incidents.get(key)
        if tracked is None:
            tracked = _Tracked(item.stream_seq, ev, ev.time, labels_for(ev))
            self._incidents[key] = tracked
        elif item.stream_seq == 0 or item.stream_seq > tracked.stream_seq:
            labels = labels_for(ev)
            # A new severity is a new alert identity: end the old one now, or it lingers until its endsAt.
            tracked.retired = [self._alert(tracked, now, ends_at=now)] if labels != tracked.labels else []
            tracked.stream_seq, tracked.event, tracked.labels = item.stream_seq, ev, labels
        return [*tracked.retired, self._alert(tracked, now)]

    def open_alerts(self, now: datetime) -> list[Alert]:
        """Every incident not resolved, as alerts to send again."""
        return [
            self._alert(t, now)
            for t in self._incidents.values()
            if t.event.data.state != incidents.IncidentState.RESOLVED
        ]

    def _alert(self, t: _Tracked, now: datetime, ends_at: datetime | None = None) -> Alert:
        ev, d = t.event, t.event.data
        if ends_at is None:
            if d.state == incidents.IncidentState.RESOLVED:
                ends_at = max(ev.time, t.starts_at)
            else:
                ends_at = now + timedelta(seconds=RESEND_FACTOR * self.resend_s)
        annotations = {
            "summary": d.summary,
            "evidence": orjson.dumps(d.evidence, option=orjson.OPT_SORT_KEYS).decode(),
            "incident_id": d.incident_id,
            "state": d.state,
        }
        if d.actions:
            annotations["actions"] = ", ".join(f"{a.kind}:{a.status}" for a in d.actions)
        if not d.mode.acts:
            annotations["mode"] = d.mode
        alert: Alert = {
            "labels": dict(t.labels),
            "annotations": annotations,
            "startsAt": _rfc3339(t.starts_at),
            "endsAt": _rfc3339(ends_at),
        }
        link = self.link(ev)
        if link:
            annotations["link"] = link
            alert["generatorURL"] = link
        return alert

    def link(self, ev: incidents.IncidentEvent) -> str | None:
        if not self.link_template:
            return None
        d = ev.data
        values = {
            "incident_id": d.incident_id,
            "rule_id": d.rule_id,
            "node": d.node,
            "gpu": "" if d.gpu_index is None else str(d.gpu_index),
            "cluster": cluster_of(ev),
        }
        return self.link_template.format_map({k: urllib.parse.quote(v, safe="") for k, v in values.items()})


def check_link_template(template: str | None) -> None:
    """Refuse, before anything starts, a link template with a field the alerts do not have."""
    if not template:
        return
    try:
        template.format_map(dict.fromkeys(("incident_id", "rule_id", "node", "gpu", "cluster"), "x"))
    except (KeyError, IndexError, ValueError) as e:
        raise errors.PermanentError(f"bad alertmanager link template {template!r}: {e!r}") from None


def _headers(extra: Mapping[str, str]) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "User-Agent": f"healer-alertmanager/{healer.__version__}",
        **extra,
    }


class AlertmanagerSink:
    """Forwards incidents to one Alertmanager and keeps the open ones alive there."""

    def __init__(
        self,
        bus: base.Bus,
        subj: subjects.Subjects,
        url: str,
        settings: config.FeedSettings,
        *,
        dead_letter: pathlib.Path | None = None,
        headers: Mapping[str, str] | None = None,
        start: Literal["all", "new"] = "new",
        metrics: forward.ForwardMetrics | None = None,
        post: forward.Post = webhook.post,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        check_link_template(settings.alertmanager_link)
        self.url = alerts_url(url)
        self.bus = bus
        self.subj = subj
        self.settings = settings
        self.headers = _headers(headers or {})
        self.post = post
        self.now: Callable[[], datetime] = clock or (lambda: datetime.now(tz=UTC))
        self.book = AlertBook(settings.alertmanager_resend_s, settings.alertmanager_link)
        self.forwarder = forward.Forwarder(
            bus,
            subj,
            self.url,
            settings,
            dead_letter=dead_letter,
            start=start,
            metrics=metrics,
            post=post,
            render=self._render,
        )
        self.log = log.bind(durable=settings.durable)

    def _render(self, item: envelope.Item) -> webhook.Message | None:
        alerts = self.book.apply(item, self.now())
        if not alerts:
            return None
        return webhook.Message(self.headers, orjson.dumps(alerts))

    async def rebuild(self) -> int:
        """Read the whole stream once to learn which incidents are open; returns how many are."""
        bad = 0

        def on_bad(_subject: str, _seq: int, _err: errors.DecodeError) -> None:
            nonlocal bad
            bad += 1

        def on_item(item: envelope.Item) -> None:
            self.book.apply(item, self.now())

        await tail.read(self.bus, self.subj, tail.Query(), on_item, on_bad)
        open_now = len(self.book.open_alerts(self.now()))
        self.log.info("alertmanager.rebuilt", open=open_now, malformed=bad)
        return open_now

    async def resend(self) -> int:
        """Send every open alert again (one request); returns how many. Failures are logged, not raised:
        the next round tries again, well before the alerts' ``endsAt``."""
        alerts = self.book.open_alerts(self.now())
        if not alerts:
            return 0
        try:
            await self.post(self.url, orjson.dumps(alerts), self.headers, self.settings.http_timeout_s)
        except errors.HealerError as e:
            self.log.warning("alertmanager.resend_failed", alerts=len(alerts), error=str(e))
            return 0
        self.log.debug("alertmanager.resent", alerts=len(alerts))
        return len(alerts)

    async def _resend_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.alertmanager_resend_s)
            await self.resend()

    async def run(self, stop: asyncio.Event) -> None:
        """Rebuild, then forward and resend until ``stop`` is set; raises ``PermanentError`` if it cannot go
        on. The durable consumer is made before the rebuild, so no event falls between the two."""
        try:
            await self.forwarder.ensure_consumer()
        except base.NotFound as e:
            raise errors.PermanentError(
                f"stream {self.subj.stream_incidents} does not exist: is the controller running? "
                "(healer nats provision makes it)"
            ) from e
        await self.rebuild()
        await self.resend()
        jobs = tasks.Scheduler("alertmanager", self.forwarder.metrics.task_failures, log=self.log)
        forwarding = jobs.spawn("forward", self.forwarder.run(stop), task_name="healer-alertmanager-forward")
        resending = jobs.spawn("resend", self._resend_loop(), task_name="healer-alertmanager-resend")
        try:
            done, _ = await asyncio.wait({forwarding, resending}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.set()  # the forwarder hands its in-flight event back and returns
            resending.cancel()
            await asyncio.wait([forwarding, resending])
        for task in done:  # a failure of either task (logged and counted when it ended) is this run's
            if not task.cancelled() and (failed := task.exception()) is not None:
                raise failed
