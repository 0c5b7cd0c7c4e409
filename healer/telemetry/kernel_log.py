"""KmsgWatcher: the kernel log as a telemetry source, for what NVML's events never show.

Some XIDs reach only the kernel log, every NVSwitch SXID does, and XID 74 / 144-150 need the log
line's register words to be understood. The watcher follows ``/dev/kmsg`` (any path: tests feed a
file or a FIFO) in a daemon thread, parses NVIDIA's lines (kmsg.py), maps a GPU's PCI address to its
index and UUID through ``resolve`` (the NVML source), and hands each one to the sink as an ``xid`` or
``sxid`` NodeEvent with ``source="kmsg"``.

It never replays: the kernel's boot id and the sequence number of the last record handled are kept in
``<state_dir>/kmsg.json``. After an agent restart in the same boot, records up to that number are
skipped; after a reboot (a new boot id) the ring holds only this boot's records and all are read; on
the very first start (no state) the watcher begins at the end, so days-old lines never become new
incidents. A read that fails with EPIPE means the kernel overwrote records before they were read
(the ring buffer wrapped): counted in ``counts.overruns``, logged, and reading goes on from the oldest
record still there. Any other read error closes and reopens the log (``counts.reopens``), skipping by
sequence number what was handled already. A line that names an Xid or SXid in a format the parser does
not know is counted in ``counts.parse_failures`` and logged (``kmsg_unparsed``). Reading needs
CAP_SYSLOG (or root) on /dev/kmsg unless ``kernel.dmesg_restrict=0``; docs/agent.md says how to grant
it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import select
import threading
from collections.abc import Callable
from typing import Final

import structlog

from healer.schemas import events, xids
from healer.telemetry import kmsg, source

log = structlog.get_logger(__name__)

BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"
Resolver = Callable[[kmsg.PciAddress], "tuple[int, str | None] | None"]
"""PCI address -> (GPU index, UUID) or None for an address that is not one of this node's GPUs."""


class KmsgWatcher:
    def __init__(
        self,
        node: str,
        *,
        state_dir: str | pathlib.Path,
        path: str | pathlib.Path = "/dev/kmsg",
        resolve: Resolver | None = None,
        boot_id_path: str | pathlib.Path = BOOT_ID_PATH,
        poll_s: float = 0.2,
    ) -> None:
        self.node = node
        self.path = pathlib.Path(path)
        self.state_path = pathlib.Path(state_dir) / "kmsg.json"
        self.resolve = resolve
        self.boot_id_path = pathlib.Path(boot_id_path)
        self.poll_s = poll_s
        self.counts = source.WatcherCounts("kmsg")
        self._fd: int | None = None
        self._boot_id: str | None = None
        self._skip_to: int | None = None
        self._last_seq: int | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._log = log.bind(node=node, source="kmsg", path=str(self.path))

    def start(self, sink: source.EventSink) -> None:
        if self._thread is not None:
            return
        xids.load()  # the catalogue read now, not in the first XID's path (about 0.2 s of YAML)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:  # no CAP_SYSLOG, no such file: the agent runs on without the kernel log
            self.counts.failures += 1
            self._log.error("kmsg_unavailable", error=str(e), errno=e.errno)
            return
        self._fd = fd
        self._boot_id = self._read_boot_id()
        saved = self._load_state()
        same_boot = saved is not None and saved.get("boot_id") == self._boot_id
        if saved is not None and same_boot and isinstance(saved.get("seq"), int):
            self._skip_to = int(saved["seq"])  # type: ignore[call-overload]
        elif saved is None or same_boot:  # first start, or nothing read last time: new records only
            with contextlib.suppress(OSError):  # a FIFO cannot seek; it has no past anyway
                os.lseek(fd, 0, os.SEEK_END)
            self._log.info("kmsg_reading_new_records_only", first_start=saved is None)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(sink,), name="healer-kmsg", daemon=True)
        self._thread.start()
        self._log.info("kmsg_watch_started", boot_id=self._boot_id, resume_after_seq=self._skip_to)

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None:
            thread.join(timeout=max(1.0, 5 * self.poll_s))
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
            self._save_state()
            self._log.info("kmsg_watch_stopped", records=self.counts.records, overruns=self.counts.overruns)

    def counters(self) -> list[source.WatcherCounts]:
        return [self.counts]

    # -- reading -------------------------------------------------------------------------------------
    def _run(self, sink: source.EventSink) -> None:
        pending = b""
        while not self._stop.is_set():
            fd = self._fd
            if fd is None:  # the last reopen failed: try again
                self._stop.wait(max(1.0, self.poll_s))
                self._reopen()
                continue
            try:
                ready, _, _ = select.select([fd], [], [], self.poll_s)
                if not ready:
                    continue
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            except OSError as e:
                if e.errno == errno.EPIPE:  # the ring wrapped under us: some records are gone
                    self.counts.overruns += 1
                    self._log.warning("kmsg_overrun", overruns=self.counts.overruns)
                    continue
                self.counts.failures += 1
                self._log.error("kmsg_read_failed", error=str(e), errno=e.errno)
                self._stop.wait(max(1.0, self.poll_s))
                pending = b""  # a part record is read again whole from the new descriptor
                self._reopen()
                continue
            if not chunk:  # end of a file or a FIFO without a writer: wait for more
                self._stop.wait(self.poll_s)
                continue
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                self._handle(line.decode("utf-8", errors="replace"), sink)

    def _reopen(self) -> None:
        """Open the log again after a failed read. A new reader of /dev/kmsg starts at the oldest
        record, so what was handled already is skipped by sequence number; with no number seen yet
        (a plain log) it starts at the end instead, as on a first start."""
        old, self._fd = self._fd, None
        if old is not None:
            with contextlib.suppress(OSError):
                os.close(old)
        if self._stop.is_set():
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            self.counts.failures += 1
            self._log.error("kmsg_reopen_failed", error=str(e), errno=e.errno)
            return
        seen = [s for s in (self._last_seq, self._skip_to) if s is not None]
        if seen:
            self._skip_to = max(seen)
        else:
            with contextlib.suppress(OSError):
                os.lseek(fd, 0, os.SEEK_END)
        self._fd = fd
        self.counts.reopens += 1
        self._log.info("kmsg_reopened", reopens=self.counts.reopens, resume_after_seq=self._skip_to)

    def _handle(self, line: str, sink: source.EventSink) -> None:
        record = kmsg.parse_record(line)
        if record is None:
            return
        self.counts.records += 1
        if record.seq is not None:
            if self._skip_to is not None and record.seq <= self._skip_to:
                self.counts.skipped += 1
                return
            self._last_seq = record.seq
        found = kmsg.parse_nvidia(record.message)
        if found is None:
            if kmsg.names_nvidia(record.message):
                self.counts.parse_failures += 1
                self._log.warning("kmsg_unparsed", message=record.message[:512])
            return
        event = self._event(found)
        self.counts.events += 1
        try:
            sink(event)
        except Exception:
            self._log.exception("kmsg_sink_failed", event_id=event.id)
        if record.seq is not None:
            self._save_state()

    def _event(self, found: kmsg.NvidiaLine) -> events.NodeEvent:
        pci = str(found.pci)
        if found.kind == "sxid":
            message = f"SXID {found.code} on NVSwitch {pci}: {found.text}"
            self._log.warning("kmsg_sxid", sxid=found.code, pci=pci)
            return events.new(
                self.node, "sxid", xid=found.code, message=message[:4096], source="kmsg",
                pci_bus_id=pci, details=found.details,
            )  # fmt: skip
        where = self.resolve(found.pci) if self.resolve is not None else None
        index, uuid = where if where is not None else (None, None)
        gpu = f"GPU {index}" if index is not None else "an unknown GPU"
        name = xids.load().name(found.code)
        message = f"XID {found.code} on {gpu} (PCI {pci}): {name}: {found.text}"
        self._log.warning("kmsg_xid", xid=found.code, gpu_index=index, gpu_uuid=uuid, pci=pci, pid=found.pid)
        return events.new(
            self.node, "xid", gpu_index=index, gpu_uuid=uuid, xid=found.code, message=message[:4096],
            source="kmsg", pid=found.pid, process=found.process, pci_bus_id=pci, details=found.details,
        )  # fmt: skip

    # -- state ---------------------------------------------------------------------------------------
    def _read_boot_id(self) -> str | None:
        try:
            return self.boot_id_path.read_text(encoding="utf-8").strip() or None
        except OSError:
            return None

    def _load_state(self) -> dict[str, object] | None:
        try:
            data = json.loads(self.state_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            self._log.warning("kmsg_state_unreadable", error=str(e))
            return None
        return data if isinstance(data, dict) else None

    def _save_state(self) -> None:
        if self._last_seq is None and self._skip_to is None:
            state: dict[str, object] = {"boot_id": self._boot_id, "seq": None}
        else:
            seq = max(s for s in (self._last_seq, self._skip_to) if s is not None)
            state = {"boot_id": self._boot_id, "seq": seq}
        tmp = self.state_path.with_suffix(".tmp")
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(state), encoding="utf-8")
            os.replace(tmp, self.state_path)
        except OSError as e:
            self._log.error("kmsg_state_write_failed", error=str(e))
