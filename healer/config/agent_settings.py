"""The node agent's settings (``agent.*``)."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import pydantic

from healer.config import base

PORT_RESET_PLACEHOLDERS = ("device", "port", "netdev")
"""What a port reset command (``agent.port_reset_*``) may name: the HCA, the port number, the netdev."""
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


class AgentSettings(base.Group):
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
    state_dir: str = pydantic.Field(default_factory=base.default_state_dir)
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
