"""``healer doctor``'s host checks: the kernel log, RDMA ports, this process's privileges, Fabric Manager,
DCGM and the job map, each read where the agent reads it (``agent.kmsg_path``, ``agent.sysfs_root``,
``/proc``), so a test points them at fixture trees.

Privileges are this process's effective capabilities (``CapEff`` in ``/proc/self/status``), checked
against what each action needs (docs/agent.md, "Privileges by rung"); the device files are checked with
``os.access`` as this user.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import subprocess
from typing import Final

from healer.agent import doctor
from healer.schemas import fabric
from healer.telemetry import fabricmanager, rdma

CAPABILITIES: Final = {"CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21, "CAP_SYSLOG": 34}
"""The capabilities healer's actions use, by bit number in ``CapEff``."""


@dataclasses.dataclass(frozen=True, slots=True)
class HostPaths:
    kmsg: str = "/dev/kmsg"
    sysfs_root: str = "/sys"
    proc_root: str = "/proc"
    """The host's procfs (``agent.proc_root``: ``/host/proc`` in the DaemonSet), for Fabric Manager."""
    fabric_manager_pid_file: str | None = None
    self_proc: str = "/proc"
    """This process's own procfs: its identity, and whether it shares the host's PID namespace."""
    dev_root: str = "/dev"
    job_map_dir: str | None = None


@dataclasses.dataclass(slots=True)
class HostFacts:
    checks: list[doctor.Check] = dataclasses.field(default_factory=list)
    kmsg: bool = False
    ports: list[fabric.PortSample] = dataclasses.field(default_factory=list)
    caps: frozenset[str] = frozenset()
    root: bool = False
    umad: bool = False
    dcgmi: bool = False
    host_pid: bool = False
    """In the host's PID namespace (kthreadd is pid 2 there): NVML's process lists are then this view's."""


def identity(proc_root: str = "/proc") -> tuple[int, frozenset[str]]:
    """(effective uid, the effective capabilities healer cares about) of this process, from
    ``<proc_root>/self/status``; unreadable: this process's uid and no capabilities."""
    try:
        text = (pathlib.Path(proc_root) / "self" / "status").read_text()
    except OSError:
        return os.geteuid(), frozenset()
    lines = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    uid_fields = lines.get("Uid", "").split()
    uid = int(uid_fields[1]) if len(uid_fields) > 1 else os.geteuid()
    mask = int(lines.get("CapEff", "0").strip() or "0", 16)
    return uid, frozenset(name for name, bit in CAPABILITIES.items() if mask >> bit & 1)


def host_pid_namespace(proc_root: str = "/proc") -> bool:
    """Whether this process sees the host's processes: pid 2 is the kernel's kthreadd only there."""
    try:
        return (pathlib.Path(proc_root) / "2" / "comm").read_text().strip() == "kthreadd"
    except OSError:
        return False


def run(paths: HostPaths, *, fabric_expected: bool) -> HostFacts:
    uid, caps = identity(paths.self_proc)
    facts = HostFacts(caps=caps, root=uid == 0, host_pid=host_pid_namespace(paths.self_proc))
    facts.checks.append(
        doctor.Check(
            "host.privileges",
            doctor.Status.INFO,
            f"uid {uid}, capabilities {sorted(caps) or 'none'}, "
            f"{'host' if facts.host_pid else 'own (container)'} PID namespace",
            data={"uid": uid, "capabilities": sorted(caps), "host_pid": facts.host_pid},
        )
    )
    facts.checks.append(_kmsg(paths.kmsg, facts))
    facts.checks.extend(_ports(paths, facts))
    facts.checks.append(_fabric_manager(paths, fabric_expected))
    facts.checks.append(_dcgmi(facts))
    facts.checks.append(_job_map(paths.job_map_dir))
    return facts


def _kmsg(path: str, facts: HostFacts) -> doctor.Check:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return doctor.Check(
            "host.kmsg",
            doctor.Status.WARN,
            f"{path} not readable: {e.strerror or e}",
            "XID/SXID lines from the kernel log need CAP_SYSLOG (root) and, in a pod, privileged: true "
            "or agent.kmsg_watch: false",
        )
    try:
        os.read(fd, 8192)
    except BlockingIOError:
        pass  # nothing new to read: the open is what matters
    except OSError as e:
        return doctor.Check(
            "host.kmsg", doctor.Status.WARN, f"{path} opened but not readable: {e.strerror or e}"
        )
    finally:
        os.close(fd)
    facts.kmsg = True
    return doctor.Check("host.kmsg", doctor.Status.OK, f"{path} readable")


def _ports(paths: HostPaths, facts: HostFacts) -> list[doctor.Check]:
    reader = rdma.PortReader(paths.sysfs_root)
    facts.ports = ports = reader.read()
    if not ports:
        return [
            doctor.Check(
                "rdma.ports", doctor.Status.INFO, f"no RDMA ports under {paths.sysfs_root}/class/infiniband"
            )
        ]
    out: list[doctor.Check] = []
    for p in ports:
        values = p.model_dump()
        counters = {n: values[n] for n in sorted(fabric.ALL_COUNTERS) if n in values}
        read = sorted(n for n, v in counters.items() if v is not None)
        data = {
            "link_layer": p.link_layer,
            "state": p.state,
            "rate_gbps": p.rate_gbps,
            "netdev": p.netdev,
            "counters": read,
        }
        status = doctor.Status.OK if read and p.state is not None else doctor.Status.WARN
        out.append(
            doctor.Check(
                "rdma.ports",
                status,
                f"{p.device}/{p.port} {p.link_layer} state {p.state}, {len(read)} counters",
                "" if status is doctor.Status.OK else "counters or state unreadable in sysfs",
                data={"port": f"{p.device}/{p.port}", **data},
            )
        )
    if reader.read_errors:
        out.append(
            doctor.Check("rdma.ports", doctor.Status.WARN, f"{reader.read_errors} sysfs files unreadable")
        )
    umad = sorted((pathlib.Path(paths.dev_root) / "infiniband").glob("umad*"))
    facts.umad = bool(umad) and all(os.access(u, os.R_OK | os.W_OK) for u in umad)
    return out


def _fabric_manager(paths: HostPaths, expected: bool) -> doctor.Check:
    running = fabricmanager.FabricManagerProbe(
        paths.proc_root, pid_file=paths.fabric_manager_pid_file
    ).running()
    if not expected:
        return doctor.Check(
            "fabric_manager",
            doctor.Status.INFO,
            "no GPU reports an NVLink fabric: not needed",
            data={"running": running},
        )
    if running:
        return doctor.Check(
            "fabric_manager", doctor.Status.OK, "nv-fabricmanager runs", data={"running": True}
        )
    return doctor.Check(
        "fabric_manager",
        doctor.Status.FAIL,
        "GPUs report an NVLink fabric but nv-fabricmanager does not run",
        "systemctl enable --now nvidia-fabricmanager (its version must match the driver's)",
        data={"running": False},
    )


def _dcgmi(facts: HostFacts) -> doctor.Check:
    exe = shutil.which("dcgmi")
    if exe is None:
        return doctor.Check(
            "dcgmi",
            doctor.Status.WARN,
            "dcgmi not installed: ladder validation skips dcgmi diag",
            "install datacenter-gpu-manager (and run nv-hostengine) for diag after a repair",
        )
    try:
        done = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return doctor.Check("dcgmi", doctor.Status.WARN, f"dcgmi --version failed: {e}")
    version = next(
        (ln.split(":", 1)[1].strip() for ln in done.stdout.splitlines() if "version" in ln.lower()),
        done.stdout.strip()[:80],
    )
    facts.dcgmi = done.returncode == 0
    status = doctor.Status.OK if facts.dcgmi else doctor.Status.WARN
    return doctor.Check(
        "dcgmi", status, f"dcgmi {version} (exit {done.returncode})", data={"version": version}
    )


def _job_map(path: str | None) -> doctor.Check:
    if path is None:
        return doctor.Check(
            "job_map", doctor.Status.INFO, "agent.job_map_dir not set: frames carry no job ids"
        )
    p = pathlib.Path(path)
    if not p.is_dir() or not os.access(p, os.R_OK | os.X_OK):
        return doctor.Check(
            "job_map",
            doctor.Status.WARN,
            f"{path} is not a readable directory",
            "create it or point agent.job_map_dir at the scheduler's job-mapping directory",
        )
    files = sum(1 for f in p.iterdir() if f.is_file())
    return doctor.Check(
        "job_map", doctor.Status.OK, f"{path} readable, {files} GPU files", data={"files": files}
    )
