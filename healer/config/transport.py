"""The NATS connection and the back-off every retry uses."""

from __future__ import annotations

import urllib.parse

import pydantic

from healer.config import base


class NatsSettings(base.Group):
    url: str = "nats://127.0.0.1:4222"
    """NATS server URL(s), comma-separated for a cluster."""
    prefix: str = "healer"
    """Subject prefix; streams and buckets are named after it (HEALER_TELEMETRY, healer-state ...)."""
    creds_file: str | None = None
    """NATS credentials file (user JWT + NKey seed) for this identity; see docs/security.md."""
    nkey_seed_file: str | None = None
    """NKey seed file of this identity (``healer nats config`` writes one per node, controller, feed)."""
    inbox_prefix: str | None = None
    """Reply-inbox prefix this identity's permissions allow (``healer nats config`` writes it)."""
    tls_ca_file: str | None = None
    """CA bundle that signed the NATS servers' certificates (use ``tls://`` URLs); unset: system CAs."""
    tls_cert_file: str | None = None
    """Client certificate, for servers that verify clients (``verify: true``); needs ``tls_key_file``."""
    tls_key_file: str | None = None
    """Private key of ``tls_cert_file``."""
    connect_timeout_s: float = 2.0
    """Timeout of one connection attempt."""
    reconnect_wait_s: float = 0.5
    """Pause between reconnection attempts once connected (nats-py reconnects forever)."""
    replicas: int = pydantic.Field(default=1, ge=1, le=5)
    """JetStream replicas for streams and buckets (3 on a production cluster)."""
    telemetry_max_age_s: float = 3600.0
    """How long HEALER_TELEMETRY keeps frames (replay, model training)."""
    events_max_age_s: float = 7 * 86400.0
    """How long HEALER_EVENTS keeps node events."""
    incidents_max_age_s: float = 90 * 86400.0
    """How long HEALER_INCIDENTS keeps the incident feed."""
    dedup_window_s: float = 3600.0
    """Nats-Msg-Id duplicate window on the events and incidents streams: a resend within it is dropped."""
    fleet_nodes: int | None = pydantic.Field(default=None, ge=1)
    """Nodes expected to publish telemetry. Set, it sizes HEALER_TELEMETRY's byte limit as
    ``fleet_nodes * frame_bytes * telemetry_max_age_s / frame_interval_s`` (unless
    ``telemetry_max_bytes`` is set); see the sizing table in docs/deployment.md."""
    frame_bytes: int = pydantic.Field(default=8000, ge=100)
    """Bytes one NodeFrame takes in the stream, for sizing (an 8-GPU node's frame is about 7.7 kB)."""
    frame_interval_s: float = pydantic.Field(default=1.0, gt=0)
    """The agents' publishing interval (``agent.interval_s``), for sizing the telemetry stream."""
    telemetry_max_bytes: int | None = pydantic.Field(default=None, ge=2**20)
    """Byte limit of HEALER_TELEMETRY: past it the oldest frames are dropped, so telemetry can never
    fill the store. Unset: sized from ``fleet_nodes``, or 1 GiB without it."""
    events_max_bytes: int = pydantic.Field(default=256 * 2**20, ge=2**20)
    """Byte limit of HEALER_EVENTS (oldest dropped past it). Every stream and bucket has one, so
    JetStream reserves their space: telemetry cannot take what events, incidents and KV need."""
    incidents_max_bytes: int = pydantic.Field(default=512 * 2**20, ge=2**20)
    """Byte limit (and reservation) of HEALER_INCIDENTS, the incident feed (oldest dropped past it)."""
    state_max_bytes: int = pydantic.Field(default=64 * 2**20, ge=2**20)
    """Byte limit (and reservation) of the ``healer-state`` KV bucket."""
    leases_max_bytes: int = pydantic.Field(default=8 * 2**20, ge=2**20)
    """Byte limit (and reservation) of the ``healer-leases`` KV bucket."""
    lease_ttl_s: float = 10.0
    """TTL of the healer-leases bucket (leader and shard leases)."""
    request_timeout_s: float = pydantic.Field(default=2.0, gt=0)
    """Longest one JetStream API or KV request waits for its answer. A request sent while a stream
    elects a new leader (a server lost) goes unanswered; it fails after this long and is retried, so
    keep it well under ``lease_ttl_s``."""

    def telemetry_bytes(self) -> int:
        """HEALER_TELEMETRY's byte limit: set, sized from the fleet, or 1 GiB."""
        if self.telemetry_max_bytes is not None:
            return self.telemetry_max_bytes
        if self.fleet_nodes is None:
            return DEFAULT_TELEMETRY_BYTES
        frames = self.telemetry_max_age_s / self.frame_interval_s
        return max(2**20, int(self.fleet_nodes * self.frame_bytes * frames))

    def reserved_bytes(self) -> int:
        """What healer's streams and buckets reserve together (per server holding a replica)."""
        return (
            self.telemetry_bytes() + self.events_max_bytes + self.incidents_max_bytes
            + self.state_max_bytes + self.leases_max_bytes
        )  # fmt: skip

    @pydantic.field_validator("url")
    @classmethod
    def _urls_parse(cls, value: str) -> str:
        """A malformed URL is a setting to fix, found before any connection is tried."""
        servers = [u.strip() for u in value.split(",") if u.strip()]
        if not servers:
            raise ValueError("no NATS URL given")
        for server in servers:
            # as nats-py reads it: a bare "host" or "host:port" means nats://
            parsed = urllib.parse.urlsplit(server if "://" in server else f"nats://{server}")
            try:
                parsed.port  # noqa: B018 - raises ValueError on a port that is not a number
            except ValueError:
                raise ValueError(f"{server!r} has a bad port") from None
            if parsed.scheme not in NATS_SCHEMES or not parsed.hostname:
                raise ValueError(
                    f"{server!r} is not a NATS URL (expected nats://HOST:PORT or tls://HOST:PORT)"
                )
        return value


DEFAULT_TELEMETRY_BYTES = 2**30
"""HEALER_TELEMETRY's byte limit when neither ``telemetry_max_bytes`` nor ``fleet_nodes`` is set."""

NATS_SCHEMES = ("nats", "tls", "ws", "wss")
"""URL schemes nats-py connects with."""


class RetrySettings(base.Group):
    initial_delay_s: float = 0.2
    """First back-off delay for temporary failures (initial connect, actions)."""
    max_delay_s: float = 5.0
    """Back-off ceiling."""
    attempts: int = pydantic.Field(default=0, ge=0)
    """Attempts before giving up; 0 means keep trying until stopped."""
