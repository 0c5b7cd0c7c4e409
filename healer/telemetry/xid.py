"""XidWatcher: NVML XID and double-bit ECC events, handed on the moment the driver reports them.

Frames are sampled once per interval, but an XID (the driver's fault code: 79 fell off the bus, 48
double-bit ECC, 94/95 contained/uncontained ECC, ...) is a discrete event that a rule must see even when
it happens between two samples. NVML delivers them through an event set: ``nvmlEventSetCreate``,
``nvmlDeviceRegisterEvents`` per GPU, then ``nvmlEventSetWait_v2`` blocks for up to ``wait_ms``. That
wait runs in a daemon thread; each event becomes a ``xid`` NodeEvent given to the sink at once (the
agent's sink hops onto its event loop thread-safely). A double-bit ECC event has no XID of its own and
is reported as XID 48, the driver's XID for it, saying so in the message. ``stop()`` ends the thread
within about ``wait_ms`` and frees the set.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any, Final

import structlog

from healer import errors
from healer.schemas import events, xids
from healer.telemetry import nvml, nvml_control, source

log = structlog.get_logger(__name__)

DBE_XID: Final = 48
"""The XID the driver logs for a double-bit ECC error."""


class XidWatcher:
    """Watches every GPU of the node for XIDs and double-bit ECC errors. ``nvml``: pynvml or a fake."""

    def __init__(self, node: str, nvml: ModuleType | None = None, *, wait_ms: int = 500) -> None:
        self.node = node
        self.wait_ms = wait_ms
        self._module = nvml
        self._nv: ModuleType | None = None
        self._set: Any = None
        self._uuids: dict[int, str | None] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._log = log.bind(node=node, source="nvml_events")
        self.counts = source.WatcherCounts("nvml")

    def counters(self) -> list[source.WatcherCounts]:
        return [self.counts]

    @property
    def watching(self) -> list[int]:
        """Indexes of the GPUs registered for events."""
        return sorted(self._uuids)

    def start(self, sink: source.EventSink) -> None:
        if self._nv is not None:
            return
        xids.load()  # the catalogue read now, not in the first XID's path (about 0.2 s of YAML)
        nv = self._module if self._module is not None else nvml.load_pynvml()
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            raise nvml_control.init_failed(nv, e) from e
        self._nv = nv
        try:
            self._set = nv.nvmlEventSetCreate()
            self._register_all(nv)
        except nv.NVMLError as e:
            self._release()
            raise errors.TemporaryError(f"NVML event set failed: {e}", delay=5.0) from e
        if not self._uuids:
            self._log.warning("xid_watch_unavailable", reason="no GPU accepts event registration")
            self._release()
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(nv, sink), name=f"healer-xid-{self.node}", daemon=True
        )
        self._thread.start()
        self._log.info("xid_watch_started", gpus=self.watching, wait_ms=self.wait_ms)

    def _register_all(self, nv: ModuleType) -> None:
        wanted = nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
        supported_fn = getattr(nv, "nvmlDeviceGetSupportedEventTypes", None)
        for index in range(nv.nvmlDeviceGetCount()):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                mask = wanted & supported_fn(handle) if supported_fn is not None else wanted
                if not mask:
                    self._log.warning("xid_watch_gpu_skipped", gpu_index=index, reason="no XID/ECC events")
                    continue
                nv.nvmlDeviceRegisterEvents(handle, mask, self._set)
                uuid = nv.nvmlDeviceGetUUID(handle)
            except nv.NVMLError as e:  # NotSupported, GpuIsLost, ...: this GPU is not watched
                self._log.warning(
                    "xid_watch_gpu_skipped", gpu_index=index, reason=str(e), error=type(e).__name__
                )
                continue
            self._uuids[index] = uuid.decode() if isinstance(uuid, bytes) else uuid

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None:
            thread.join(timeout=max(1.0, 4 * self.wait_ms / 1000.0))
            if thread.is_alive():  # NVML wait did not return: freeing the set under it would be unsafe
                self._log.error("xid_watch_stop_timeout", wait_ms=self.wait_ms)
                return
        self._release()

    def _release(self) -> None:
        nv, self._nv = self._nv, None
        if nv is None:
            return
        event_set, self._set = self._set, None
        self._uuids = {}
        try:
            if event_set is not None:
                nv.nvmlEventSetFree(event_set)
            nv.nvmlShutdown()
        except nv.NVMLError as e:
            self._log.warning("xid_watch_release_failed", error=str(e))
        self._log.info("xid_watch_stopped")

    def _run(self, nv: ModuleType, sink: source.EventSink) -> None:
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        timeout_cls = nvml_control.error_classes(nv, "NVMLError_Timeout")
        lost_cls = nvml_control.error_classes(nv, "NVMLError_GpuIsLost")
        reported: set[int | str] = set()  # error codes already reported; cleared by the next event
        backoff_s = max(0.05, self.wait_ms / 1000.0)
        while not self._stop.is_set():
            try:
                data = wait(self._set, self.wait_ms)
            except timeout_cls:
                continue
            except Exception as e:
                code = getattr(e, "value", None)
                tag: int | str = code if isinstance(code, int) else type(e).__name__
                self.counts.failures += 1
                if tag not in reported:
                    reported.add(tag)
                    lost = isinstance(e, lost_cls)
                    self._log.error("xid_watch_wait_failed", error=str(e), code=tag)
                    kind: events.EventKind = "gpu_lost" if lost else "nvml_error"
                    self._emit(
                        sink, events.new(self.node, kind, message=f"NVML event wait failed: {e} ({tag})")
                    )
                self._stop.wait(backoff_s)
                continue
            reported.clear()
            event = self._event(nv, data)
            if event is not None:
                self._emit(sink, event)

    def _event(self, nv: ModuleType, data: Any) -> events.NodeEvent | None:
        index: int | None
        try:
            index = int(nv.nvmlDeviceGetIndex(data.device))
        except Exception:  # a lost GPU may not say who it is any more
            index = None
        uuid = self._uuids.get(index) if index is not None else None
        where = f"GPU {index}" if index is not None else "a GPU"
        if data.eventType & nv.nvmlEventTypeXidCriticalError:
            xid = int(data.eventData)
            message = f"XID {xid} on {where}: {xids.load().name(xid)}"
        elif data.eventType & nv.nvmlEventTypeDoubleBitEccError:
            xid = DBE_XID
            message = f"double-bit ECC error event on {where} (NVML event, reported as XID {DBE_XID})"
        else:
            self.counts.parse_failures += 1
            self._log.debug("xid_watch_event_ignored", event_type=int(data.eventType), gpu_index=index)
            return None
        self._log.warning("nvml_xid", gpu_index=index, gpu_uuid=uuid, xid=xid)
        return events.new(
            self.node, "xid", gpu_index=index, gpu_uuid=uuid, xid=xid, message=message, source="nvml"
        )

    def _emit(self, sink: source.EventSink, event: events.NodeEvent) -> None:
        self.counts.events += 1
        try:
            sink(event)
        except Exception:
            self._log.exception("xid_watch_sink_failed", event_id=event.id, kind=event.kind)
