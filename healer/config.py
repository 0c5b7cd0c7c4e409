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
    lease_ttl_s: float = 10.0
    """TTL of the healer-leases bucket (leader and shard leases)."""
    request_timeout_s: float = pydantic.Field(default=2.0, gt=0)
    """Longest one JetStream API or KV request waits for its answer. A request sent while a stream
    elects a new leader (a server lost) goes unanswered; it fails after this long and is retried, so
    keep it well under ``lease_ttl_s``."""


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


class FeedSettings(_Group):
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


class ActuatorSettings(_Group):
    """How healer acts on schedulers and agents; see docs/remediation.md."""

    retry_attempts: int = pydantic.Field(default=3, ge=1)
    """Tries of one action when it fails temporarily (scheduler unreachable, a timeout, HTTP 5xx); after
    the last one the outcome is ``failed-temporary`` and the controller escalates the incident."""
    retry_initial_delay_s: float = pydantic.Field(default=0.5, ge=0)
    """First pause between tries; it doubles each time (or is the delay the error asked for, if longer)."""
    retry_max_delay_s: float = pydantic.Field(default=10.0, ge=0)
    """Ceiling of the pause between tries."""
    call_timeout_s: float = pydantic.Field(default=15.0, gt=0)
    """Timeout of one call to a scheduler (one ``scontrol``/``squeue``/``sinfo`` run, one API request)."""
    node_name_template: str = "{node}"
    """How a telemetry node name becomes the scheduler's node name: ``{node}`` is the full name,
    ``{short}`` the part before the first dot (``gpu01.dc1.example`` → ``gpu01``). Identity by default."""
    node_map_file: str | None = None
    """YAML file mapping telemetry node names to scheduler node names (``gpu01.dc1: gpu-a01``); an entry
    there wins over ``node_name_template``."""
    slurm_bin_dir: str | None = None
    """Directory holding ``scontrol``, ``squeue``, ``sinfo`` and ``scancel``; unset: found on PATH."""
    slurm_conf: str | None = None
    """``SLURM_CONF`` for the Slurm commands; unset: Slurm's own default (or the inherited variable)."""
    slurm_checkpoint_signal: str | None = None
    """Signal sent to a node's jobs before they are requeued (e.g. ``USR1``) so they can checkpoint;
    unset: no signal, requeue at once."""
    slurm_checkpoint_grace_s: float = pydantic.Field(default=60.0, ge=0)
    """How long to wait after the checkpoint signal before requeueing (only with a signal set)."""
    slurm_requeue_settle_s: float = pydantic.Field(default=10.0, ge=0)
    """How long to wait for a requeued job to become pending before lifting its requeue hold
    (``StartTime=now``); past it the job keeps Slurm's short hold and starts a little later."""
    kube_config: str | None = None
    """Kubeconfig file; unset: in-cluster service account, else the default kubeconfig."""
    kube_context: str | None = None
    """Kubeconfig context; unset: the current context."""
    kube_taint: bool = True
    """Also put the taint ``healer.io/gpu-fault:NoSchedule`` on nodes healer cordons."""
    kube_evict_timeout_s: float = pydantic.Field(default=300.0, gt=0)
    """How long migrate keeps retrying evictions a PodDisruptionBudget refuses (HTTP 429) before it
    reports the pods not moved."""
    kube_evict_backoff_s: float = pydantic.Field(default=5.0, gt=0)
    """First pause between eviction retries of one pod (doubles, at most 60 s)."""
    power_reply_timeout_s: float = pydantic.Field(default=5.0, gt=0)
    """How long to wait for the node agent's reply to a power command."""
    power_command_ttl_s: float = pydantic.Field(default=30.0, gt=0)
    """Expiry of a power command: the agent refuses it once this long has passed since it was issued."""
    power_confirm_timeout_s: float = pydantic.Field(default=10.0, gt=0)
    """How long to wait for a telemetry frame showing the new power limit after the agent's reply."""
    power_confirm_poll_s: float = pydantic.Field(default=0.5, gt=0)
    """How often the latest frames are looked at while confirming a power limit."""
    power_tolerance_w: float = pydantic.Field(default=1.0, ge=0)
    """A reported power limit within this many watts of the requested one counts as applied."""


class ControllerSettings(_Group):
    rules_dir: str = "rules"
    """Directory of rule files (*.yaml); watched and hot-reloaded."""
    mode: Literal["enforce", "dry-run", "observe"] = "dry-run"
    """enforce: act; dry-run: decide and publish, touch nothing; observe: incidents only."""
    actuator: Literal["log", "slurm", "kubernetes"] = "log"
    """Where cordon/drain/migrate go. Power limits always go to the node agent."""
    cluster: str = "default"
    """Cluster name, in every incident's CloudEvent ``source`` (healer://<cluster>/controller)."""
    tick_s: float = pydantic.Field(default=1.0, gt=0)
    """Rule evaluation interval."""
    model: str | None = None
    """Anomaly model directory (``models/default``); unset: ``anomaly_score`` is 0 everywhere."""
    anomaly_interval_s: float = pydantic.Field(default=30.0, gt=0)
    """How often the anomaly model scores the fleet (one batch; the model's window bucket is 30 s)."""
    reload_check_s: float = pydantic.Field(default=2.0, gt=0)
    """How often the rules directory is checked for changes."""
    labels_refresh_s: float = pydantic.Field(default=300.0, ge=0)
    """How often node labels for rules' ``match.labels`` are read from the scheduler actuator
    (Kubernetes node labels; Slurm ``partition`` and ``features``); 0: never. The log actuator has none."""
    labels_timeout_s: float = pydantic.Field(default=30.0, gt=0)
    """Longest a label refresh may take; past it the previous labels stay and the failure is counted."""
    telemetry_connection: bool = True
    """Receive telemetry on a NATS connection of its own: a flood of frames (and the server cutting a
    slow consumer off) then never delays lease renewals, KV and events, which use the main one."""
    frames_buffer_mib: float = pydantic.Field(default=128.0, gt=0)
    """Frames received and not yet ingested, at most (nats-py's pending limit for the telemetry
    subscription, 15,000 8-GPU frames at the default): past it frames are dropped and counted
    (``healer_controller_frames_dropped_total``), never queued without bound."""
    gpus_per_node: int = pydantic.Field(default=8, ge=1, le=256)
    """Expected GPUs per node (fleet-state sizing; frames may carry fewer or more)."""
    stale_after_s: float = pydantic.Field(default=300.0, gt=0)
    """A node silent this long is dropped from the evaluated fleet (node-silent rules fire before)."""
    shards: int = pydantic.Field(default=1, ge=1)
    """Number of controller shards; each owns the nodes whose name hashes to it."""
    shard: int = pydantic.Field(default=0, ge=0)
    """This process's shard (0 .. shards-1)."""
    metrics_port: int = pydantic.Field(default=9742, ge=0, le=65535)
    """Prometheus /metrics port; 0 turns it off."""
    breaker_max_nodes: int = pydantic.Field(default=50, ge=1)
    """Circuit breaker: at most this many nodes cordoned/drained by healer in the window..."""
    breaker_max_percent: float = pydantic.Field(default=10.0, gt=0, le=100)
    """...and at most this percentage of the known fleet (never fewer than one node)."""
    breaker_window_s: float = pydantic.Field(default=3600.0, gt=0)
    """Sliding window of the circuit breaker."""
    action_cooldown_s: float = pydantic.Field(default=600.0, ge=0)
    """A power cap on the same node for another incident waits at least this long (no flapping)."""
    actions_per_minute: int = pydantic.Field(default=60, ge=1)
    """Fleet-wide rate limit per action kind."""
    repeat_faults: int = pydantic.Field(default=3, ge=2)
    """This many incidents on one GPU within ``repeat_window_s`` escalate to hardware inspection."""
    repeat_window_s: float = pydantic.Field(default=86400.0, gt=0)
    """Window for counting repeat faults on one GPU."""
    power_cap_escalate_s: float = pydantic.Field(default=900.0, gt=0)
    """An incident still firing this long after its power cap escalates to a cordon (the ladder)."""
    action_retries: int = pydantic.Field(default=3, ge=0)
    """Temporary action failures retried this many times (one per tick) before the incident escalates."""
    uncordon_hold_s: float = pydantic.Field(default=300.0, ge=0)
    """After an incident resolves, wait this long before undoing healer's cordon."""


class LogSettings(_Group):
    level: Literal["debug", "info", "warning", "error"] = "info"
    """Lowest level logged."""
    format: Literal["auto", "json", "console"] = "auto"
    """``auto``: JSON when stderr is not a terminal, readable lines when it is."""


class Settings(_Group):
    nats: NatsSettings = pydantic.Field(default_factory=NatsSettings)
    retry: RetrySettings = pydantic.Field(default_factory=RetrySettings)
    agent: AgentSettings = pydantic.Field(default_factory=AgentSettings)
    feed: FeedSettings = pydantic.Field(default_factory=FeedSettings)
    controller: ControllerSettings = pydantic.Field(default_factory=ControllerSettings)
    log: LogSettings = pydantic.Field(default_factory=LogSettings)
    actuators: ActuatorSettings = pydantic.Field(default_factory=ActuatorSettings)


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


def reference_markdown() -> str:
    """docs/configuration.md, generated from the models so it cannot drift (a test checks it)."""
    lines = [
        "# Configuration",
        "",
        "Generated by `healer config docs` from `healer/config.py`; do not edit by hand.",
        "",
        "Precedence, lowest first: defaults, the YAML file (`--config FILE` or `HEALER_CONFIG`), environment",
        "variables `HEALER_<GROUP>_<FIELD>`, command-line flags. `healer config show` prints the effective",
        "values. A file is grouped like this table:",
        "",
        "```yaml",
        "nats:",
        "  url: nats://nats-0.nats:4222,nats://nats-1.nats:4222",
        "  replicas: 3",
        "agent:",
        "  interval_s: 1",
        "```",
    ]
    for group_name, field in Settings.model_fields.items():
        group_model = field.annotation
        assert isinstance(group_model, type)
        assert issubclass(group_model, _Group)
        lines += [
            "",
            f"## `{group_name}`",
            "",
            "| field | environment | default | what |",
            "| --- | --- | --- | --- |",
        ]
        for name, f in group_model.model_fields.items():
            default = "(host-dependent)" if f.default_factory is not None else repr(f.default)
            if group_name == "agent" and name == "state_dir":
                default = "`$XDG_STATE_HOME/healer`"
            var = f"HEALER_{group_name}_{name}".upper()
            lines.append(f"| `{name}` | `{var}` | {default} | {(f.description or '').replace('|', '/')} |")
    return "\n".join(lines) + "\n"
