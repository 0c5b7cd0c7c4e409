"""Read every RDMA port of the node (InfiniBand and RoCE) from sysfs, once per frame.

The layout is the kernel's (``Documentation/ABI/stable/sysfs-class-infiniband``)::

    <root>/class/infiniband/<device>/ports/<n>/{state,phys_state,rate,link_layer}
    <root>/class/infiniband/<device>/ports/<n>/counters/<PortCounters>
    <root>/class/infiniband/<device>/ports/<n>/hw_counters/<driver counters>      (mlx5, optional)
    <root>/class/infiniband/<device>/ports/<n>/gid_attrs/ndevs/0                  (RoCE: the netdev)
    <root>/class/infiniband/<device>/device/net/<ifname>                         (or the PCI device's)
    <root>/class/net/<ifname>/carrier_changes

``root`` is the setting ``agent.sysfs_root`` (``/sys``), so tests and operators can point the agent at a
recorded tree. Which ports exist and which files each has is found by a scan (at the first read, every
``rescan_s``, and at once when a port's file vanished: an HCA that fell off the bus), so a frame costs
only the reads of the changing files, each an ``open``/``read``/``close`` of a few bytes. A node without
``class/infiniband`` has no ports: an empty list, never an error. A file that cannot be read or parsed
is ``None`` in that port's sample, counted in ``read_errors`` and logged once per file.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import time
from collections.abc import Callable
from typing import Any

import structlog

from healer.schemas import fabric

log = structlog.get_logger(__name__)
RESCAN_S = 30.0
"""How often the tree is scanned for ports that appeared (one that vanished is noticed at once)."""
_READ_MAX = 128


@dataclasses.dataclass(frozen=True, slots=True)
class _File:
    field: str
    path: str
    kind: str  # "int": a counter; "x4": a data counter in 4-byte words; "enum": "4: ACTIVE"; "rate"


@dataclasses.dataclass(frozen=True, slots=True)
class _Port:
    device: str
    port: int
    static: dict[str, Any]
    files: tuple[_File, ...]


class PortReader:
    """``read()`` → one PortSample per RDMA port under ``root``, sorted by device and port."""

    def __init__(
        self, root: str | os.PathLike[str] = "/sys", *, rescan_s: float = RESCAN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.root = pathlib.Path(root)
        self.rescan_s = rescan_s
        self.clock = clock
        self.read_errors = 0
        """Files that could not be read or parsed (each is None in its sample)."""
        self.scans = 0
        self._ports: list[_Port] = []
        self._next_scan = -float("inf")
        self._warned: set[str] = set()

    # -- the per-frame path
    def read(self) -> list[fabric.PortSample]:
        if self.clock() >= self._next_scan:
            self._scan()
        out: list[fabric.PortSample] = []
        vanished = False
        for port in self._ports:
            values: dict[str, Any] = dict(port.static)
            gone = False
            for f in port.files:
                try:
                    values[f.field] = _parse(f.kind, _read(f.path))
                except FileNotFoundError:
                    gone = True
                    break
                except (OSError, ValueError) as e:
                    values[f.field] = None
                    self._bad(f.path, e)
            if gone:
                vanished = True
                continue
            out.append(fabric.PortSample(device=port.device, port=port.port, **values))
        if vanished:  # an HCA (or its netdev) went away: find out what is left before the next frame
            self._next_scan = -float("inf")
        return out

    # -- the scan
    def _scan(self) -> None:
        self.scans += 1
        self._next_scan = self.clock() + self.rescan_s
        base = self.root / "class" / "infiniband"
        try:
            devices = sorted(os.listdir(base))
        except FileNotFoundError:
            self._ports = []  # no RDMA on this node
            return
        except OSError as e:
            self._bad(str(base), e)
            self._ports = []
            return
        ports: list[_Port] = []
        for device in devices:
            try:
                numbers = sorted(int(n) for n in os.listdir(base / device / "ports") if n.isdigit())
            except OSError:
                continue  # vanished between listing and reading, or not a device directory
            for n in numbers:
                found = self._port(base / device, device, n)
                if found is not None:
                    ports.append(found)
        if [(p.device, p.port) for p in ports] != [(p.device, p.port) for p in self._ports]:
            log.info("rdma.ports_found", ports=[f"{p.device}/{p.port}" for p in ports], root=str(self.root))
        self._ports = ports

    def _port(self, dev_dir: pathlib.Path, device: str, n: int) -> _Port | None:
        port_dir = dev_dir / "ports" / str(n)
        if not _name_ok(device):
            return None  # not a name the wire schema takes: skip it rather than fail every frame
        static: dict[str, Any] = {"link_layer": _text(port_dir / "link_layer")}
        files = [
            _File("state", str(port_dir / "state"), "enum"),
            _File("phys_state", str(port_dir / "phys_state"), "enum"),
            _File("rate_gbps", str(port_dir / "rate"), "rate"),
        ]
        for field, name in fabric.COUNTERS.items():
            path = port_dir / "counters" / name
            if path.is_file():
                files.append(_File(field, str(path), "x4" if field in fabric.DATA_COUNTERS else "int"))
        hw = port_dir / "hw_counters"
        for name in fabric.HW_COUNTERS:
            if (hw / name).is_file():
                files.append(_File(name, str(hw / name), "int"))
        netdev = _netdev(dev_dir, port_dir, n)
        if netdev is not None and len(netdev) <= 32:
            static["netdev"] = netdev
            carrier = self.root / "class" / "net" / netdev / "carrier_changes"
            if carrier.is_file():
                files.append(_File("carrier_changes", str(carrier), "int"))
        return _Port(device, n, static, tuple(files))

    def _bad(self, path: str, e: Exception) -> None:
        self.read_errors += 1
        if path not in self._warned:
            self._warned.add(path)
            log.warning("rdma.unreadable", path=path, error=str(e) or repr(e))


def _name_ok(device: str) -> bool:
    return (
        0 < len(device) <= 64
        and device.isascii()
        and device[0].isalnum()
        and all(c.isalnum() or c in "_.-" for c in device)
    )


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, _READ_MAX)
    finally:
        os.close(fd)


def _parse(kind: str, raw: bytes) -> int | float:
    if kind == "int":
        return int(raw)
    if kind == "x4":
        return int(raw) * 4
    head = raw.split(b":", 1)[0] if kind == "enum" else raw.split(None, 1)[0]
    return int(head) if kind == "enum" else float(head)


def _text(path: pathlib.Path) -> str | None:
    try:
        value = path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return value[:32] or None


def _netdev(dev_dir: pathlib.Path, port_dir: pathlib.Path, n: int) -> str | None:
    """The port's network device: GID 0's netdev (RoCE), else the PCI device's only netdev (or the one
    whose ``dev_port`` is this port's, counting from 0)."""
    name = _text(port_dir / "gid_attrs" / "ndevs" / "0")
    if name:
        return name
    try:
        names = sorted(os.listdir(dev_dir / "device" / "net"))
    except OSError:
        return None
    if len(names) == 1:
        return names[0]
    for candidate in names:
        dev_port = _text(dev_dir / "device" / "net" / candidate / "dev_port")
        if dev_port is not None and dev_port.isdigit() and int(dev_port) == n - 1:
            return candidate
    return None


def write_tree(recording: str, root: str | os.PathLike[str]) -> pathlib.Path:
    """Lay a recorded sysfs tree out under ``root``: one ``path:content`` line per file, as
    ``cd /sys && grep -R . class/infiniband/*/ports/*/ class/net/*/carrier_changes`` prints them
    (``#`` lines are comments). Returns ``root``; tests and the benchmark point the reader at it."""
    base = pathlib.Path(root)
    for line in recording.splitlines():
        if not line or line.startswith("#"):
            continue
        rel, sep, content = line.partition(":")
        path = (base / rel).resolve()
        if not sep or base.resolve() not in path.parents:
            raise ValueError(f"not a recorded sysfs line: {line!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content + "\n")
    return base
