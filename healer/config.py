"""Settings, grouped and documented in one place.

Precedence, lowest first: the defaults below, a YAML file (``--config``, or ``HEALER_CONFIG``), then
environment variables named ``HEALER_<GROUP>_<FIELD>`` (``HEALER_NATS_URL``, ``HEALER_AGENT_INTERVAL_S``,
``HEALER_RETRY_MAX_DELAY_S`` ...), then command-line flags. Every field says what it is for; ``healer
config show`` prints the effective values.
"""

from __future__ import annotations

import enum
import json
import os
import pathlib
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any, Literal

import pydantic
import yaml

from healer import errors
from healer.schemas import incidents


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


class RetrySettings(_Group):
    initial_delay_s: float = 0.2
    """First back-off delay for temporary failures (initial connect, actions)."""
    max_delay_s: float = 5.0
    """Back-off ceiling."""
    attempts: int = pydantic.Field(default=0, ge=0)
    """Attempts before giving up; 0 means keep trying until stopped."""


PORT_RESET_PLACEHOLDERS = ("device", "port", "netdev")
"""What a port reset command (``agent.port_reset_*``) may name: the HCA, the port number, the netdev."""
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


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
    job_map_dir: str | None = None
    """Directory with one file per GPU index listing the job ids on it (a Slurm prolog writes them, as
    for dcgm-exporter's ``--hpc-job-mapping-dir``); the GPU metrics then carry an ``hpc_job`` label."""
    kmsg_watch: bool = True
    """Follow the kernel log for NVIDIA XID and NVSwitch SXID lines (``source: nvml`` only); needs read
    access to ``kmsg_path`` (CAP_SYSLOG or root, see docs/agent.md); without it the agent logs
    ``kmsg_unavailable`` and runs on with NVML events alone."""
    kmsg_path: str = "/dev/kmsg"
    """The kernel log device to follow (a file or FIFO of kmsg records works too, for tests)."""
    xid_dedupe_window_s: float = pydantic.Field(default=5.0, ge=0)
    """An XID for the same GPU and code seen again within this time (by NVML and the kernel log, or
    as several log lines of one fault) becomes one event."""
    reboot_command: list[str] | None = None
    """The command that reboots this host when the controller's recovery ladder asks (``reboot_node``),
    e.g. ``["systemctl", "reboot"]``; in the Kubernetes DaemonSet (hostPID, privileged)
    ``["nsenter", "-t", "1", "-m", "--", "systemctl", "reboot"]``. Unset: ``reboot_node`` is refused."""
    xid_log_wait_s: float = pydantic.Field(default=1.0, ge=0, le=30)
    """How long an XID from NVML waits for the kernel log's line of the same fault, which is passed
    instead because it names the process and the registers (``kmsg_watch`` only; 0: never wait)."""
    rdma_ports: bool = True
    """Read the node's RDMA ports (InfiniBand, RoCE) from sysfs into every frame (docs/agent.md). Off:
    frames carry no ``ports`` and stay ``healer.telemetry.v1`` (for controllers older than v2 frames)."""
    sysfs_root: str = "/sys"
    """Where sysfs is: the RDMA ports are read under ``<sysfs_root>/class/infiniband`` and their netdevs'
    ``carrier_changes`` under ``<sysfs_root>/class/net``; point it at a recorded tree to test."""
    fabric_manager: Literal["auto", "on", "off"] = "auto"
    """Report whether NVIDIA Fabric Manager (``nv-fabricmanager``) runs, in every frame
    (``fabric_manager_up``): ``auto`` once some GPU reports an NVLink fabric state (an NVSwitch system),
    ``on`` always, ``off`` never."""
    proc_root: str = "/proc"
    """Where the host's /proc is (the Kubernetes DaemonSet runs with hostPID): the Fabric Manager check
    looks for its process there."""
    fabric_manager_pid_file: str | None = None
    """Fabric Manager's pid file, tried before a scan of ``proc_root`` (its systemd unit writes
    ``/var/run/nvidia-fabricmanager/nv-fabricmanager.pid``); unset: the scan alone."""
    port_reset_ethernet: list[list[str]] = pydantic.Field(
        default_factory=lambda: [
            ["ip", "link", "set", "dev", "{netdev}", "down"],
            ["ip", "link", "set", "dev", "{netdev}", "up"],
        ]
    )
    """How the recovery ladder's ``reset_port`` rung bounces a RoCE port (``link_layer`` Ethernet): argument
    lists run one after the other, never through a shell; ``{netdev}`` is the port's network device
    (found in sysfs, ``device/net/``), ``{device}`` and ``{port}`` the HCA and port (``mlx5_0``, ``1``).
    ``ip link`` needs CAP_NET_ADMIN (docs/agent.md). An empty list: RoCE ports are never reset. In the
    environment: JSON, ``[["ip", "link", "set", "dev", "{netdev}", "down"], [...]]``."""
    port_reset_infiniband: list[list[str]] = pydantic.Field(
        default_factory=lambda: [
            ["ibportstate", "-C", "{device}", "-P", "{port}", "-D", "0", "{port}", "reset"]
        ]
    )
    """How ``reset_port`` bounces an InfiniBand port: by default infiniband-diags' ``ibportstate`` resets
    the local HCA port by direct route (``-D 0``, the CA and port named with ``-C``/``-P``; releases
    older than rdma-core's infiniband-diags refuse to reset a CA port). It needs access to the umad
    device (``/dev/infiniband/umad*``). The same placeholders as ``port_reset_ethernet``; an empty
    list: InfiniBand ports are never reset."""

    @pydantic.field_validator("port_reset_ethernet", "port_reset_infiniband", mode="before")
    @classmethod
    def _json_in_env(cls, value: Any) -> Any:
        """In the environment a list of argument lists is JSON (``[["ip", "link", ...], ...]``)."""
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError as e:
                raise ValueError(f"not a JSON list of argument lists: {e}") from e
        return value

    @pydantic.field_validator("port_reset_ethernet", "port_reset_infiniband")
    @classmethod
    def _argv_templates(cls, value: list[list[str]]) -> list[list[str]]:
        for argv in value:
            if not argv or not argv[0]:
                raise ValueError("each command is a non-empty argument list")
            for arg in argv:
                for name in _PLACEHOLDER.findall(arg):
                    if name not in PORT_RESET_PLACEHOLDERS:
                        known = ", ".join(f"{{{p}}}" for p in PORT_RESET_PLACEHOLDERS)
                        raise ValueError(f"unknown placeholder {{{name}}} in {arg!r} (known: {known})")
        return value


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
    alertmanager_resend_s: float = pydantic.Field(default=60.0, gt=0)
    """``healer alertmanager``: how often every open incident is sent to Alertmanager again. Each alert's
    ``endsAt`` is four times this ahead (as Prometheus does), so Alertmanager resolves the alerts by
    itself if healer stops sending."""
    alertmanager_link: str | None = None
    """``healer alertmanager``: link put in each alert (``generatorURL`` and the ``link`` annotation), with
    ``{incident_id}``, ``{rule_id}``, ``{node}``, ``{gpu}``, ``{cluster}`` filled in
    (``https://grafana.example/d/gpu?var-node={node}``); unset: no link."""


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
    gpu_reset_timeout_s: float = pydantic.Field(default=120.0, gt=0, le=600)
    """The most a GPU reset may take on the node (``reset_gpu``'s ``timeout_s``); the reply is awaited
    this long plus ``power_reply_timeout_s``."""
    port_reset_timeout_s: float = pydantic.Field(default=120.0, gt=0, le=600)
    """The most a port link reset may take on the node (``reset_port``'s ``timeout_s``): the bounce, then
    the wait for sysfs to read the port ACTIVE again (an InfiniBand port waits for the subnet manager
    after it trained); the reply is awaited this long plus ``power_reply_timeout_s``."""
    validate_timeout_s: float = pydantic.Field(default=300.0, gt=0, le=600)
    """The most the node's validation may take (``dcgmi diag -r 1`` takes about a minute); the reply is
    awaited this long plus ``power_reply_timeout_s``."""


ActuatorName = Literal["log", "slurm", "kubernetes"]
"""The scheduler actuators (``actuators.factory.REGISTRY`` builds each; the CLI offers these)."""


class DomainLimit(_Group):
    """How much of one failure domain healer may take out of service in the breaker's window (#27)."""

    max_nodes: int | None = pydantic.Field(default=None, ge=1)
    """At most this many nodes of any one domain of this key."""
    max_percent: float | None = pydantic.Field(default=None, gt=0, le=100)
    """At most this percentage of any one domain of this key (never fewer than one node)."""


class SharedCauseRule(_Group):
    """Shared-cause detection for one kind of signal: the rules whose id matches (#27). A field left
    unset is the fleet-wide ``shared_cause_window_s`` / ``shared_cause_min_nodes``."""

    window_s: float | None = pydantic.Field(default=None, ge=0)
    """Nodes of one domain opening incidents of this rule within this long make a shared cause (a node
    going silent with its PDU is seconds; a coolant rise over a row can take minutes); 0: never."""
    min_nodes: int | None = pydantic.Field(default=None, ge=2)
    """How many nodes of one domain with this rule make a shared cause."""


class PowerBudget(_Group):
    """A power budget for one failure domain (#30): the GPUs of the domain together stay under it."""

    key: str = pydantic.Field(min_length=1, max_length=63)
    """The domain key of the topology (``rack``, ``pdu``, ``row``, any key)."""
    value: str = pydantic.Field(min_length=1, max_length=253)
    """The domain (``r7``): the nodes whose ``key`` label has this value."""
    breaker_kw: float | None = pydantic.Field(default=None, gt=0, le=100000)
    """Source ``breaker``: the breaker's rating in kW; the budget is ``breaker_kw x derating``."""
    derating: float = pydantic.Field(default=0.8, gt=0, le=1)
    """Fraction of the breaker's rating that may be drawn continuously (0.8: the NEC's 80 % rule)."""
    contract_kw: float | None = pydantic.Field(default=None, gt=0, le=100000)
    """Source ``contract``: the budget in kW as agreed (a colocation contract). Exactly one of
    ``breaker_kw`` or ``contract_kw``."""
    gpu_share: float = pydantic.Field(default=1.0, gt=0, le=1)
    """The part of the budget the GPUs may draw (the rest is CPUs, fans, network: healer sees only GPU
    power)."""
    hold_s: float = pydantic.Field(default=10.0, ge=0, le=3600)
    """The longest the domain may run over its budget before healer's lower limits hold (a short spike is
    not capped: breakers trip on sustained load). The caps are decided that much earlier as their
    limits take to show in the readings (the lag of the domain's last cap step, at most half of this)."""
    hysteresis_percent: float = pydantic.Field(default=5.0, ge=0, le=50)
    """Caps aim this far under the budget, and limits are raised again only while the domain, with the
    next step fully drawn, stays this far under it: no cap / restore oscillation."""
    restore_after_s: float = pydantic.Field(default=120.0, ge=0)
    """Headroom must last this long before the first restore step, and between steps."""
    restore_step_percent: float = pydantic.Field(default=10.0, gt=0, le=100)
    """Each restore step raises a capped GPU's limit by this percentage of its default limit."""
    policy: Literal["proportional", "priority"] = "proportional"
    """proportional: every GPU gives up the same share of what it draws above its minimum limit;
    priority: lower-priority GPUs are capped first (to their minimum), higher ones only if that is not
    enough."""
    priority_label: str = "priority"
    """Under ``policy: priority``, a GPU whose job ``controller.power_priority`` does not rank is ranked by
    this label of its node (from the inventory file or the scheduler's node labels)."""
    priorities: dict[str, int] = pydantic.Field(default_factory=dict)
    """Rank of each ``priority_label`` value (higher: capped later); a node without the label, or with a
    value not listed, ranks ``controller.power_priority.default``."""

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> PowerBudget:
        if (self.breaker_kw is None) == (self.contract_kw is None):
            raise ValueError("a power budget takes exactly one of 'breaker_kw' or 'contract_kw'")
        return self

    @property
    def source(self) -> Literal["breaker", "contract"]:
        return "breaker" if self.breaker_kw is not None else "contract"

    @property
    def domain(self) -> str:
        return f"{self.key}={self.value}"

    @property
    def gpu_budget_w(self) -> float:
        """What the domain's GPUs may draw together, in W."""
        kw = self.breaker_kw * self.derating if self.breaker_kw is not None else self.contract_kw
        assert kw is not None
        return kw * 1000.0 * self.gpu_share


class PowerPriority(_Group):
    """How a power budget's ``policy: priority`` ranks a GPU by the job running on it (#30;
    docs/power-budgets.md): the job's Slurm QOS, else its Slurm partition, else its Kubernetes priority
    class, as listed here (higher: capped later); a GPU whose job none of them ranks (no job known, or
    its values not listed) is ranked by its node's label (the budget's ``priority_label`` and
    ``priorities``), else ``default``. The job on each GPU and its QOS, partition or priority class come
    from the scheduler's job listing (Slurm ``squeue --json``, Kubernetes pods requesting
    ``nvidia.com/gpu``), every ``jobs_refresh_s``."""

    qos: dict[str, int] = pydantic.Field(default_factory=dict)
    """Slurm QOS name -> rank (e.g. ``{high: 10, normal: 5, low: 0}``). A job's QOS is known only with
    Slurm accounting (slurmdbd): without it ``squeue`` reports none, and the partition ranks it."""
    partition: dict[str, int] = pydantic.Field(default_factory=dict)
    """Slurm partition -> rank (e.g. ``{urgent: 10, batch: 0}``), for a job whose QOS is not listed."""
    priority_class: dict[str, int] = pydantic.Field(default_factory=dict)
    """Kubernetes ``priorityClassName`` of the job's pods -> rank (e.g. ``{training-high: 10}``)."""
    default: int = 0
    """The rank of a GPU that neither its job nor its node's label ranks (an idle GPU, a job started
    since the last listing, a value not listed)."""

    @property
    def by_job(self) -> bool:
        """Whether any job attribute is ranked at all."""
        return bool(self.qos or self.partition or self.priority_class)


class ControllerSettings(_Group):
    rules_dir: str = "rules"
    """Directory of rule files (*.yaml); watched and hot-reloaded."""
    mode: incidents.Mode = incidents.Mode.DRY_RUN
    """enforce: act; dry-run: decide and publish, touch nothing; observe: incidents only."""
    actuator: ActuatorName = "log"
    """Where cordon/drain/migrate go. Power limits always go to the node agent."""
    cluster: str = "default"
    """Cluster name, in every incident's CloudEvent ``source`` (healer://<cluster>/controller)."""
    tick_s: float = pydantic.Field(default=1.0, gt=0)
    """Rule evaluation interval."""
    frame_arrivals_s: float = pydantic.Field(default=0.1, ge=0)
    """How often, between ticks, the rules without ``for`` are evaluated on the nodes whose frames
    arrived since (a new ECC error, an XID counter, a port gone down): their faults are acted on within
    about this long of the frame, not at the next tick. Spaced further apart while it would take more
    than a tenth of the time. 0: only at ticks."""
    model: str | None = None
    """Anomaly model directory (``models/default``); unset: ``anomaly_score`` is 0 everywhere."""
    anomaly_interval_s: float = pydantic.Field(default=30.0, gt=0)
    """How often the anomaly model scores the fleet (one batch; the model's window bucket is 30 s)."""
    anomaly_save_s: float = pydantic.Field(default=300.0, gt=0)
    """How often the leader saves what the anomaly model learned about this fleet (per-GPU and per-node
    baselines) to KV ``anomaly.state``; also at shutdown. A restarted controller starts from it."""
    stragglers: bool = True
    """Fail-slow detection (docs/fail-slow.md): compare each loaded GPU with its job's other GPUs (or its
    own history) every minute; rules read the verdict as ``straggler_score``. Off: it reads 0."""
    straggler_window_s: float = pydantic.Field(default=60.0, gt=0)
    """The fail-slow scorer's window: GPUs are compared once per window and a straggler is confirmed
    after 3 lagging windows in a row; a node's frames are folded every twelfth of it."""
    jobs_refresh_s: float = pydantic.Field(default=60.0, ge=0)
    """How often the job placements (which job runs on which node) are read from the scheduler actuator
    (Slurm ``squeue --json``; Kubernetes pods requesting ``nvidia.com/gpu``) for the fail-slow peer
    groups and the power budgets' job priorities (``power_priority``; a job started since the last
    listing is not ranked by it yet); 0: never (the agents' job-mapping directories alone)."""
    jobs_unlisted_refresh_s: float = pydantic.Field(default=10.0, ge=0)
    """With ``power_priority`` ranking by job: a job id in the frames (the agents' job-mapping
    directories) that the last job listing did not describe, a job started since, brings the next
    listing forward, at most this often, so its QOS, partition or priority class is known within
    seconds rather than ``jobs_refresh_s``. An id that the listing after it does not describe either
    (another naming than the scheduler's) brings none again; 0: never."""
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
    """Frames received and not yet ingested, at most (15,000 8-GPU frames at the default; each message
    counts 512 bytes beside its payload, so a flood of tiny ones is bounded too), in the telemetry
    subscription's backlog, which is fair by node (healer/bus/fair.py): past it frames are dropped and
    counted (``healer_controller_frames_dropped_total``), never queued without bound."""
    frames_per_node: int = pydantic.Field(default=4, ge=1, le=10_000)
    """Frames of one node (one telemetry subject) waiting to be ingested, at most: a node (or a
    flooder on its subject) sending faster than the controller ingests loses its own oldest frames,
    never another node's. Frames are ingested round-robin over the nodes, and a message that is
    certainly not a frame (too large, not JSON) is counted and dropped as it is read, before it queues."""
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
    """...and at most this percentage of the admitted fleet (``admission``; never fewer than one node)."""
    breaker_window_s: float = pydantic.Field(default=3600.0, gt=0)
    """Sliding window of the circuit breaker."""
    domain_limits: dict[str, DomainLimit] = pydantic.Field(default_factory=dict)
    """Blast radius per failure domain, by domain key (``rack``, ``switch``, ``nvl_domain``, any key of
    the topology): e.g. ``{rack: {max_nodes: 2}, switch: {max_percent: 25}}``. A node is taken out of
    service only while every domain it belongs to stays within its limit (nodes healer took out in the
    breaker's window, counted in the breaker's KV document); beyond it the action waits and the
    incident names the domain and the limit. Unlike the fleet-wide breaker it opens nothing: a rack at
    its limit does not stop remediation elsewhere. Empty: no per-domain limit."""
    power_budgets: list[PowerBudget] = pydantic.Field(default_factory=list)
    """Power budgets per failure domain (#30; docs/power-budgets.md): e.g. ``[{key: rack, value: r7,
    breaker_kw: 60, derating: 0.8}]``. Empty: no budget."""
    power_priority: PowerPriority = pydantic.Field(default_factory=PowerPriority)
    """How ``policy: priority`` budgets rank each GPU by its job's Slurm QOS or partition, or its
    Kubernetes priority class (#30; docs/power-budgets.md), e.g. ``{qos: {high: 10, low: 0}, partition:
    {urgent: 10}, priority_class: {training-high: 10}}``. Needs ``stragglers`` (the job index lives
    there) and ``jobs_refresh_s`` > 0. Empty: node labels alone rank."""
    energy_accounting: bool = False
    """Energy per failure domain and per job (#30; docs/power-budgets.md) from the frames' NVML energy
    counters: ``healer_controller_energy_joules_total{domain}`` and
    ``healer_controller_job_energy_joules_total{job}`` on /metrics, and the energy of a power-budget
    episode in its incident's evidence. Off: nothing is counted (a few microseconds per frame saved)."""
    energy_keys: list[str] = pydantic.Field(default_factory=list)
    """With ``energy_accounting``: the topology keys whose domains are counted (``[rack, pdu]``); empty:
    every key of the admitted topology."""
    action_cooldown_s: float = pydantic.Field(default=600.0, ge=0)
    """A power cap on the same node for another incident waits at least this long (no flapping)."""
    actions_per_minute: int = pydantic.Field(default=60, ge=1)
    """Fleet-wide rate limit per action kind. A step of per-GPU power changes (a budget's caps across a
    domain, a node-wide incident's caps) counts once per node it acts on, reserved whole."""
    repeat_faults: int = pydantic.Field(default=3, ge=2)
    """This many incidents on one GPU within ``repeat_window_s`` escalate to hardware inspection."""
    repeat_window_s: float = pydantic.Field(default=86400.0, gt=0)
    """Window for counting repeat faults on one GPU."""
    leaderless_margin_s: float = pydantic.Field(default=10.0, ge=0)
    """A shard whose lease no controller was seen holding for longer than ``nats.lease_ttl_s`` plus this
    is leaderless: ``healer_controller_leaderless`` says so (deploy/prometheus alerts on it)."""
    correlate_window_s: float = pydantic.Field(default=120.0, ge=0)
    """A rule firing on a GPU (or a node-scope rule on a node) that has an incident opened less than this
    long ago joins it instead of opening another: one incident per fault (docs/controller.md); 0 turns
    correlation off."""
    shared_cause_window_s: float = pydantic.Field(default=60.0, ge=0)
    """Shared-cause domain incidents (#27): when ``shared_cause_min_nodes`` nodes of one failure domain
    open incidents of the same rule within this long, healer opens one ``shared-cause`` incident naming
    the domain as the suspected component and holds its members' repairs (GPU reset, reboot, hardware
    replacement; containment such as a cordon or drain still runs) until the domain recovers; 0 turns
    it off. This is the window of every rule without its own in ``shared_cause_rules``."""
    shared_cause_min_nodes: int = pydantic.Field(default=3, ge=2)
    """How many nodes of one domain make a shared cause (every rule without its own count in
    ``shared_cause_rules``)."""
    shared_cause_rules: dict[str, SharedCauseRule] = pydantic.Field(default_factory=dict)
    """The window and the count per kind of signal, by rule id or a glob of rule ids (e.g. ``{node-silent:
    {window_s: 20, min_nodes: 4}, "inlet-*": {window_s: 300}}``): an exact id wins, then the longest
    matching glob; a rule matched by none uses ``shared_cause_window_s`` and ``shared_cause_min_nodes``."""
    shared_cause_keys: list[str] = pydantic.Field(default_factory=list)
    """Domain keys looked at for shared causes (e.g. ``[switch, pdu, rack, cooling_loop]``); empty: every
    key of the topology."""
    power_cap_escalate_s: float = pydantic.Field(default=900.0, gt=0)
    """An incident still firing this long after its power cap escalates to a cordon (the ladder)."""
    action_retries: int = pydantic.Field(default=3, ge=0)
    """Temporary action failures retried this many times (one per tick) before the incident escalates."""
    uncordon_hold_s: float = pydantic.Field(default=300.0, ge=0)
    """After an incident resolves, wait this long before undoing healer's cordon."""
    recovery: bool = True
    """Walk the recovery ladders the rule pack declares (``ladders:``; docs/remediation.md): reset the
    GPU, reboot the node, validate, return it to service, or ask for a hardware replacement. Off: every
    fault ends at containment (the node stays out until a person acts)."""
    max_concurrent_reboots: int = pydantic.Field(default=1, ge=1)
    """Recovery ladders: at most this many nodes rebooting at once (all shards together); a further
    reboot waits. One by default: a reboot is the biggest hammer healer has, and a fleet that needs
    several at once is more likely to have a shared cause (a bad driver roll-out) than bad GPUs."""
    admission: Literal["scheduler", "file", "first-seen"] = "scheduler"
    """Which node names the controller believes in. ``scheduler``: nodes the scheduler actuator lists
    (Slurm ``sinfo``, Kubernetes nodes; asked when an unknown name first reports, at most every
    ``admission_refresh_s``); ``file``: the names in ``inventory_file``; ``first-seen``: any name that
    reports (development and demos only: anyone able to publish telemetry grows the fleet). Frames and
    events from names not admitted are dropped and counted before they allocate any state, and only
    admitted nodes count toward the breaker's fleet size."""
    inventory_file: str | None = None
    """With ``admission: file``: a YAML list of node names, or a mapping with a ``nodes`` list (the
    ``healer nats config --nodes`` file works); re-read when it changes. An entry may carry failure
    domain labels: ``{name: gpu01, rack: r07, pdu: p3, switch: leaf-07}``, or ``nodes`` as a mapping
    from name to labels."""
    topology_file: str | None = None
    """Slurm's ``topology.conf`` (topology/tree or topology/block) read for failure domains, with any
    ``admission``: a node's leaf switch is domain ``switch``, the switch above it ``switch_l2`` and so
    on; a block is domain ``block``. Re-read when it changes; a bad line is logged and skipped."""
    domain_labels: dict[str, str] = pydantic.Field(default_factory=dict)
    """Domain key -> scheduler label name, for ``admission: scheduler`` (e.g. ``{rack:
    example.com/rack}``); every ``topology.kubernetes.io/<key>`` label is domain ``<key>`` anyway."""
    domain_features: dict[str, str] = pydantic.Field(default_factory=dict)
    """Domain key -> Slurm node feature prefix, for ``admission: scheduler`` with Slurm (e.g. ``{pdu:
    pdu_}``: a node with feature ``pdu_p3`` is in domain ``pdu`` ``p3``); a feature ``<key>=<value>``
    (``Features=h100,rack=r07`` in slurm.conf) is domain ``<key>`` anyway. A scheduler label
    (``domain_labels``, ``topology.kubernetes.io/*``) naming the same key wins."""
    admission_refresh_s: float = pydantic.Field(default=10.0, gt=0)
    """With ``admission: scheduler``: the scheduler is asked about names that reported but are not
    admitted at most this often (one node list call for all of them)."""
    max_clock_skew_s: float = pydantic.Field(default=60.0, gt=0)
    """A frame or event whose ``ts`` is further than this from the controller's receive time is counted
    as skewed (``healer_controller_clock_skewed_total``). Ordering, freshness, silence and quiet
    periods always use the controller's receive time, never a node's ``ts``."""
    max_gpus_per_node: int = pydantic.Field(default=16, ge=1, le=256)
    """Most GPUs a node may report (never fewer than ``gpus_per_node``): a frame with more GPUs, a GPU
    index at or past this, or a larger ``gpus_expected`` is rejected and counted (reason
    ``too_many_gpus``); fleet state never grows wider."""
    node_retention_s: float = pydantic.Field(default=86400.0, gt=0)
    """A node silent this long is forgotten: its fleet-state row is reused, and what its rules had
    firing (``node-silent`` above all) resolves with the reason, without running ``on_resolve``
    actions (healer's cordon on a node that left stays)."""

    @pydantic.model_validator(mode="after")
    def _shard_in_range(self) -> ControllerSettings:
        if self.shard >= self.shards:
            raise ValueError(
                f"shard {self.shard} does not exist with shards={self.shards}; "
                f"shard must be 0 .. {self.shards - 1}"
            )
        return self

    @pydantic.model_validator(mode="after")
    def _budgets_enforceable(self) -> ControllerSettings:
        """A budget is refused at load rather than enforced by half: with several shards each sums and caps
        only the frames of its own nodes, and a domain's nodes are spread over the shards by a hash of
        their names (a rack of 8 lies within one of 2 shards 1 time in 128), so every shard would hold
        the whole budget against its part of the draw. Two budgets for one domain would share one state."""
        if self.power_budgets and self.shards > 1:
            domains = ", ".join(b.domain for b in self.power_budgets)
            raise ValueError(
                f"power_budgets ({domains}) need one controller shard, not shards={self.shards}: each shard "
                "sees only its own nodes' frames, and a domain's nodes are spread over the shards, so each "
                "would hold the whole budget against part of the draw (docs/power-budgets.md)"
            )
        if self.power_priority.by_job and (not self.stragglers or not self.jobs_refresh_s):
            raise ValueError(
                "power_priority ranks GPUs by their jobs, which come from the job index: it needs "
                f"stragglers: true and jobs_refresh_s > 0 (stragglers: {str(self.stragglers).lower()}, "
                f"jobs_refresh_s: {self.jobs_refresh_s:g}; docs/power-budgets.md)"
            )
        seen: set[str] = set()
        for b in self.power_budgets:
            if b.domain in seen:
                raise ValueError(f"power_budgets: {b.domain} has two budgets; give each domain one")
            seen.add(b.domain)
        return self


class UiSettings(_Group):
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


class AnomalySettings(_Group):
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
    anomaly: AnomalySettings = pydantic.Field(default_factory=AnomalySettings)
    log: LogSettings = pydantic.Field(default_factory=LogSettings)
    actuators: ActuatorSettings = pydantic.Field(default_factory=ActuatorSettings)
    ui: UiSettings = pydantic.Field(default_factory=UiSettings)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in one line: where, and what."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"line {mark.line + 1} column {mark.column + 1}: {problem}" if mark is not None else problem


def load(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Mapping[str, Any]] | None = None,
) -> Settings:
    """The one merge of every source, lowest first: defaults, the YAML file (``path``, else
    ``HEALER_CONFIG``), ``HEALER_<GROUP>_<FIELD>`` variables, then ``flags`` (group → field → value; a
    ``None`` value is a flag not given and changes nothing)."""
    env = os.environ if env is None else env
    raw: dict[str, Any] = {}
    path = path or env.get("HEALER_CONFIG")
    if path:
        try:
            loaded = yaml.safe_load(pathlib.Path(path).read_text()) or {}
        except OSError as e:
            raise errors.PermanentError(f"cannot read config {path}: {e.strerror or e}") from e
        except yaml.YAMLError as e:
            raise errors.PermanentError(f"cannot read config {path}: {_yaml_problem(e)}") from e
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
    for group_name, values in (flags or {}).items():
        for name, value in values.items():
            if value is not None:
                raw.setdefault(group_name, {})[name] = value
    try:
        return Settings.model_validate(raw)
    except pydantic.ValidationError as e:
        raise errors.PermanentError(f"bad settings: {describe(e)}") from e


def describe(e: pydantic.ValidationError) -> str:
    """A validation error as one line that names each setting (``nats.url: ...; agent.interval_s: ...``)."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" + (f" (got {err['input']!r})" if err["type"] != "value_error" else ""))
    return "; ".join(parts)


def _plain(default: Any) -> Any:
    """A default as it is written in a settings file (an enum's value, not its member)."""
    return default.value if isinstance(default, enum.Enum) else default


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
            default = "(host-dependent)" if f.default_factory is not None else repr(_plain(f.default))
            if group_name == "agent" and name == "state_dir":
                default = "`$XDG_STATE_HOME/healer`"
            var = f"HEALER_{group_name}_{name}".upper()
            lines.append(f"| `{name}` | `{var}` | {default} | {(f.description or '').replace('|', '/')} |")
    return "\n".join(lines) + "\n"
