"""Settings, grouped and documented in one place.

Precedence, lowest first: the defaults below, a YAML file (``--config``, or ``HEALER_CONFIG``), then
environment variables named ``HEALER_<GROUP>_<FIELD>`` (``HEALER_NATS_URL``, ``HEALER_AGENT_INTERVAL_S``,
``HEALER_RETRY_MAX_DELAY_S`` ...), then command-line flags. Every field says what it is for; ``healer
config show`` prints the effective values.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping
from typing import Any, Literal

import pydantic
import yaml

from healer import errors


def _default_state_dir() -> str:
    base = os.environ.get("XDG_STATE_HOME") or str(pathlib.Path.home() / ".local" / "state")
    return str(pathlib.Path(base) / "healer")


class _Group(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", use_attribute_docstrings=True)


class NatsSettings(_Group):
    url: str = "nats://127.0.0.1:4222"
    """NATS server URL(s), comma-separated for a cluster."""
    prefix: str = "healer"
    """Subject prefix; streams and buckets are named after it (HEALER_TELEMETRY, healer-state ...)."""
    creds_file: str | None = None
    """NATS credentials file (user JWT + NKey seed) for this identity; see docs/security.md."""
    nkey_seed_file: str | None = None
    """NKey seed file of this identity (``healer nats config`` writes one per node, controller, feed)."""
    inbox_prefix: str | None = None
    """Reply-inbox prefix; must be the one this identity's permissions allow (``healer nats config``
    writes it next to the seed). Unset: nats-py's default ``_INBOX``, for servers without permissions."""
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
    lease_ttl_s: float = 10.0
    """TTL of the healer-leases bucket (leader and shard leases)."""


class RetrySettings(_Group):
    initial_delay_s: float = 0.2
    """First back-off delay for temporary failures (initial connect, actions)."""
    max_delay_s: float = 5.0
    """Back-off ceiling."""
    attempts: int = pydantic.Field(default=0, ge=0)
    """Attempts before giving up; 0 means keep trying until stopped."""


class AgentSettings(_Group):
    node: str | None = None
    """This node's name as the schedulers know it; defaults to the host name."""
    interval_s: float = pydantic.Field(default=1.0, gt=0)
    """Sampling and publishing interval."""
    source: Literal["nvml", "sim"] = "nvml"
    """Where readings come from: the real GPUs through NVML, or a simulated healthy node."""
    gpus_expected: int | None = pydantic.Field(default=None, ge=0)
    """GPUs this node should have; a GPU that falls off the bus shows as a missing entry against it."""
    sim_gpus: int = pydantic.Field(default=8, ge=1, le=64)
    """GPUs of the simulated node (``source: sim``)."""
    state_dir: str = pydantic.Field(default_factory=_default_state_dir)
    """Where the agent keeps its event spool and the power limits it must be able to restore."""
    buffer_frames: int = pydantic.Field(default=300, ge=1)
    """Frames kept while NATS is away; beyond it the oldest are dropped (and counted)."""
    metrics_port: int = pydantic.Field(default=9741, ge=0, le=65535)
    """Prometheus /metrics port; 0 turns it off."""
    metrics_addr: str = "0.0.0.0"
    """Address /metrics listens on."""
    xid_watch: bool = True
    """Watch NVML events (XIDs, double-bit ECC) in a thread (``source: nvml`` only)."""


class LogSettings(_Group):
    level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level logged."""
    format: Literal["auto", "json", "console"] = "auto"
    """``auto``: JSON when stderr is not a terminal, readable lines when it is."""


class Settings(_Group):
    nats: NatsSettings = pydantic.Field(default_factory=NatsSettings)
    retry: RetrySettings = pydantic.Field(default_factory=RetrySettings)
    agent: AgentSettings = pydantic.Field(default_factory=AgentSettings)
    log: LogSettings = pydantic.Field(default_factory=LogSettings)


def load(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Defaults, then the YAML file, then ``HEALER_<GROUP>_<FIELD>`` variables."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = {}
    path = path or env.get("HEALER_CONFIG")
    if path:
        try:
            loaded = yaml.safe_load(pathlib.Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise errors.PermanentError(f"cannot read config {path}: {e}") from e
        if not isinstance(loaded, dict):
            raise errors.PermanentError(f"config {path}: top level must be a mapping of groups")
        raw = loaded
    for group_name, field in Settings.model_fields.items():
        group_model = field.annotation
        assert isinstance(group_model, type)
        assert issubclass(group_model, _Group)
        for name in group_model.model_fields:
            var = f"HEALER_{group_name}_{name}".upper()
            if var in env:
                raw.setdefault(group_name, {})[name] = env[var]
    try:
        return Settings.model_validate(raw)
    except pydantic.ValidationError as e:
        raise errors.PermanentError(f"bad settings: {e}") from e
