"""Several event watchers behind one sink, with XIDs deduplicated across them.

The NVML event watcher (xid.py) and the kernel log (kernel_log.py) both see most XIDs, and the driver
often logs one fault as several lines of the same code. Each GPU and code therefore becomes one event
per ``window_s``, whichever watcher reports it first (NVML's event is usually first; the kernel log's
pid, process name and decoded registers are then not added). Other events pass untouched. The sink
may be called from several watcher threads at once: the dedupe state is locked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import structlog

from healer.schemas import events
from healer.telemetry import source

log = structlog.get_logger(__name__)


class Combined:
    def __init__(
        self,
        watchers: Sequence[source.EventWatcher],
        *,
        window_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.watchers = list(watchers)
        self.window_s = window_s
        self.clock = clock
        self.duplicates = 0
        """XIDs dropped because one for the same GPU and code was passed within the window."""
        self._seen: dict[tuple[int, int], float] = {}
        self._lock = threading.Lock()

    def start(self, sink: source.EventSink) -> None:
        def deduped(event: events.NodeEvent) -> None:
            if self.admit(event):
                sink(event)

        for watcher in self.watchers:
            watcher.start(deduped)

    def stop(self) -> None:
        for watcher in reversed(self.watchers):
            watcher.stop()

    def admit(self, event: events.NodeEvent) -> bool:
        """False for an XID on a GPU that already had one of that code within the window."""
        if event.kind != "xid" or event.gpu_index is None or event.xid is None:
            return True
        key = (event.gpu_index, event.xid)
        now = self.clock()
        with self._lock:
            last = self._seen.get(key)
            if last is not None and now - last < self.window_s:
                self.duplicates += 1
                log.info(
                    "xid_duplicate_dropped", gpu_index=event.gpu_index, xid=event.xid, source=event.source
                )
                return False
            self._seen = {k: t for k, t in self._seen.items() if now - t < self.window_s}
            self._seen[key] = now
            return True
