"""The groups of the processes beside the agent and the controller: the feed forwarder, the status page,
the anomaly model and logging."""

from __future__ import annotations

from typing import Any, Literal

import pydantic

from healer.config import base


class FeedSettings(base.Group):
    """The incident feed's consumers: ``healer incidents tail`` and ``healer forward``."""

    durable: str = pydantic.Field(default="healer-forward", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    """Name of the forwarder's durable JetStream consumer; one name per receiver you forward to."""
    ack_wait_s: float = pydantic.Field(default=30.0, gt=0)
    """An unacknowledged event is redelivered after this; also how long a killed forwarder's event waits."""
    fetch_timeout_s: float = pydantic.Field(default=5.0, gt=0)
    """Long-poll time of one fetch from the durable consumer when the feed is idle."""
    http_timeout_s: float = pydantic.Field(default=10.0, gt=0)
    """Timeout of one HTTP POST to the receiver (connect and response)."""
    retry_initial_delay_s: float = pydantic.Field(default=0.5, gt=0)
    """First back-off delay after the receiver failed (connection error, 5xx, 408, 429)."""
    retry_max_delay_s: float = pydantic.Field(default=30.0, gt=0)
    """Back-off ceiling; a receiver's Retry-After is honoured up to this."""
    retry_attempts: int = pydantic.Field(default=0, ge=0)
    """Attempts per event before the forwarder exits (the event stays unacknowledged); 0 means forever."""
    metrics_port: int = pydantic.Field(default=0, ge=0, le=65535)
    """Prometheus /metrics port of ``healer forward``; 0 turns it off."""
    metrics_addr: str = "0.0.0.0"
    """Address the forwarder's /metrics listens on."""
    alertmanager_resend_s: float = pydantic.Field(default=60.0, gt=0)
    """``healer alertmanager``: how often every open incident is sent to Alertmanager again. Each alert's
    ``endsAt`` is four times this ahead (as Prometheus does), so Alertmanager resolves the alerts by
    itself if healer stops sending."""
    alertmanager_link: str | None = None
    """``healer alertmanager``: link put in each alert (``generatorURL`` and the ``link`` annotation), with
    ``{incident_id}``, ``{rule_id}``, ``{node}``, ``{gpu}``, ``{cluster}`` filled in
    (``https://grafana.example/d/gpu?var-node={node}``); unset: no link."""


class UiSettings(base.Group):
    """The read-only status page: ``healer ui``, or served by the controller with ``enabled``."""

    enabled: bool = False
    """Serve the status page from ``healer controller`` too (``healer ui`` always serves it)."""
    host: str = "127.0.0.1"
    """Address the page listens on. Anything but loopback needs ``token``."""
    port: int = pydantic.Field(default=9744, ge=0, le=65535)
    """Port of the page (0: any free port, printed at start)."""
    token: str | None = None
    """Bearer token every request must carry (header, or ``?token=`` once: a cookie keeps it)."""
    max_nodes: int = pydantic.Field(default=100_000, ge=1)
    """Most nodes the map holds; frames from further new names are dropped and counted (a publisher
    inventing names cannot grow the page's memory without bound)."""
    ring_len: int = pydantic.Field(default=90, ge=2, le=3600)
    """Recent readings kept per GPU for its chart (one per frame; 90 s at the agents' 1 s)."""
    history_len: int = pydantic.Field(default=125, ge=2, le=10_000)
    """Buckets of history kept per GPU for its charts, older than the recent readings (``history_step_s``
    each; 125 x 30 s is just over an hour). Each bucket is the mean of the readings in it."""
    history_step_s: float = pydantic.Field(default=30.0, gt=0)
    """Width of one history bucket (the charts' resolution past the recent readings)."""
    push_s: float = pydantic.Field(default=1.0, gt=0)
    """How often the map's changes go to the browsers."""
    temp_deadband_c: int = pydantic.Field(default=2, ge=1, le=50)
    """A cell's temperature is resent once it moved this much since the browser last heard."""
    stale_after_s: float = pydantic.Field(default=30.0, gt=0)
    """A node silent this long is drawn as silent."""
    feed_window_s: float = pydantic.Field(default=3600.0, ge=0)
    """At start, the incident feed is replayed from this long ago (timelines, recent events)."""
    group_by: tuple[str, ...] = ("rack", "partition")
    """Node labels that group the map, first found wins (from incidents' labels and ``labels_file``);
    comma-separated in the environment."""
    labels_file: str | None = None
    """YAML or JSON mapping node -> {label: value} for grouping nodes that have had no incident yet."""
    archive_db: str | None = None
    """The incident archive (``healer archive --db``) the reliability tab reads, on this host; unset: the
    tab reads the incident feed's last 30 days itself (docs/ui.md, "Reliability")."""
    reliability_cache_s: float = pydantic.Field(default=300.0, ge=0)
    """How long the reliability tab's figures are kept before they are computed again."""
    grafana_url: str | None = None
    """Grafana link for each node and GPU on the page, ``{node}`` and ``{gpu}`` filled in (URL-quoted;
    ``{gpu}`` is empty for a node), e.g. ``https://grafana.example/d/healer-overview?var-node={node}``;
    unset: no links."""

    @pydantic.field_validator("grafana_url")
    @classmethod
    def _http_link(cls, value: str | None) -> str | None:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value or None

    @pydantic.field_validator("group_by", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return tuple(v.strip() for v in value.split(",") if v.strip()) if isinstance(value, str) else value


class AnomalySettings(base.Group):
    calibration: bool = True
    """Each deciding component of the anomaly model takes its threshold from this fleet's own
    distribution of it, per pool of alike nodes (GPU model and frame interval), so that the expected
    rate of false ``anomaly-score-high`` incidents stays under ``false_alarm_budget`` (a
    peaks-over-threshold tail fit; never below the model's own edge). A pool runs in shadow until it
    has ``calibration_node_days``: its would-be incidents are counted, its scores capped at 0.5, so it
    opens nothing. Off: the model's fixed edges decide everywhere from the start (docs/anomaly.md)."""
    false_alarm_budget: float = pydantic.Field(default=1.0, gt=0)
    """False anomaly incidents per 1,000 healthy node-days the calibration holds the model to, all its
    deciding components together (each gets an equal share)."""
    calibration_node_days: float = pydantic.Field(default=2.0, ge=0)
    """Scored node-days a pool needs before its anomaly incidents go live (shadow until then)."""


class LogSettings(base.Group):
    level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level logged."""
    format: Literal["auto", "json", "console"] = "auto"
    """``auto``: JSON when stderr is not a terminal, readable lines when it is."""
