"""Several event watchers behind one sink, with XIDs deduplicated across them.

The NVML event watcher (xid.py) and the kernel log (kernel_log.py) both see most XIDs, and the driver
often logs one fault as several lines of the same code. Each GPU and code therefore becomes one event
per ``window_s``. The kernel log's version says more (the process, decoded registers: what burst rules
count distinct processes by), so with ``hold_s`` > 0 an XID from NVML waits that long for the log's
line of the same fault and is replaced by it when it comes; otherwise NVML's is passed when the hold
ends (or at ``stop()``, never lost). Other events pass untouched and at once. Watcher threads call the
sink concurrently: the dedupe state is locked, and the sink is called outside the lock. What was
dropped is counted per source of the dropped copy (an NVML XID replaced by the log's line counts as
an NVML duplicate) in ``counters()``, beside the counts of every watcher inside.
"""

from __future__ import annotations

import threading
import time
import typing
from collections.abc import Callable, Sequence

import structlog

from healer.schemas import events
from healer.telemetry import source

log = structlog.get_logger(__name__)
Key = tuple[int, int]


class Combined:
    def __init__(
        self,
        watchers: Sequence[source.EventWatcher],
        *,
        window_s: float = 5.0,
        hold_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.watchers = list(watchers)
        self.window_s = window_s
        self.hold_s = hold_s
        self.clock = clock
        self.duplicates = 0
        """XIDs dropped because one for the same GPU and code was passed (or held) within the window."""
        self.replaced = 0
        """NVML XIDs replaced by the kernel log's line of the same fault during the hold."""
        self._dropped = {s: source.WatcherCounts(s) for s in typing.get_args(events.EventSource)}
        self._seen: dict[Key, float] = {}
        self._held: dict[Key, tuple[events.NodeEvent, threading.Timer]] = {}
        self._sink: source.EventSink | None = None
        self._lock = threading.Lock()

    def start(self, sink: source.EventSink) -> None:
        self._sink = sink
        for watcher in self.watchers:
            watcher.start(self.offer)

    def stop(self) -> None:
        for watcher in reversed(self.watchers):
            watcher.stop()
        with self._lock:
            held, self._held = list(self._held.values()), {}
        for event, timer in held:  # the hold is cut short, the event is not lost
            timer.cancel()
            self._pass(event)

    def counters(self) -> list[source.WatcherCounts]:
        """The counts of every watcher inside that keeps them, then the duplicates dropped here."""
        inner = [c for w in self.watchers if isinstance(w, source.CountingWatcher) for c in w.counters()]
        return inner + list(self._dropped.values())

    def offer(self, event: events.NodeEvent) -> None:
        """What the watchers call: pass, hold, replace or drop the event."""
        if event.kind != "xid" or event.gpu_index is None or event.xid is None:
            self._pass(event)
            return
        key = (event.gpu_index, event.xid)
        with self._lock:
            now = self.clock()
            held = self._held.get(key)
            if held is not None and event.source == "kmsg":
                del self._held[key]
                held[1].cancel()
                self.replaced += 1
                self._dropped["nvml"].duplicates += 1
            elif held is not None or now - self._seen.get(key, -float("inf")) < self.window_s:
                self.duplicates += 1
                if event.source is not None:
                    self._dropped[event.source].duplicates += 1
                log.info("xid_duplicate_dropped", gpu_index=key[0], xid=key[1], source=event.source)
                return
            self._seen = {k: t for k, t in self._seen.items() if now - t < self.window_s}
            self._seen[key] = now
            if held is None and event.source == "nvml" and self.hold_s > 0:
                timer = threading.Timer(self.hold_s, self._release, (key,))
                timer.daemon = True
                self._held[key] = (event, timer)
                timer.start()
                return
        self._pass(event)

    def _release(self, key: Key) -> None:
        with self._lock:
            held = self._held.pop(key, None)
        if held is not None:
            self._pass(held[0])

    def _pass(self, event: events.NodeEvent) -> None:
        if self._sink is None:
            return
        try:
            self._sink(event)
        except Exception:
            log.exception("watcher_sink_failed", event_id=event.id, kind=event.kind)
