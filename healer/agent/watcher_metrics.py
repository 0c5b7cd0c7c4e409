"""The event watchers' counts on ``/metrics``: what an SRE needs to trust the XID and SXID path.

The watchers (NVML events, the kernel log, the dedupe that joins them) keep plain counts
(``source.WatcherCounts``); this collector reads them at each scrape, so the telemetry layer needs no
Prometheus. Every series is served from the start, at 0 for a source that is not watched (a simulated
node, ``kmsg_watch: false``), so a healthy agent shows each one and a dashboard never says "No data".
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator
from typing import Final

from prometheus_client import core as prom_core
from prometheus_client import registry as prom_registry

from healer.schemas import events
from healer.telemetry import source

SOURCES: Final = typing.get_args(events.EventSource)
BY_SOURCE: Final = (
    ("events", "healer_agent_watcher_events", "events the watchers handed on, by source"),
    (
        "duplicates",
        "healer_agent_watcher_duplicates",
        "XIDs dropped because another report of the same fault was passed, by the dropped copy's source",
    ),
    (
        "parse_failures",
        "healer_agent_watcher_parse_failures",
        "kernel-log Xid/SXid lines in no known format, NVML events of an unknown type",
    ),
    ("failures", "healer_agent_watcher_failures", "failed reads of the kernel log, failed NVML event waits"),
)
KMSG: Final = (
    ("records", "healer_agent_kmsg_records", "kernel-log records read"),
    ("overruns", "healer_agent_kmsg_overruns", "kernel-log reads that failed with EPIPE (records lost)"),
    ("skipped", "healer_agent_kmsg_skipped", "kernel-log records skipped as handled before (no replay)"),
    ("reopens", "healer_agent_kmsg_reopens", "times the kernel log was opened again after a failed read"),
)


class WatcherCollector(prom_registry.Collector):
    def __init__(self) -> None:
        self._watchers: list[source.CountingWatcher] = []

    def attach(self, watcher: source.EventWatcher) -> None:
        """Serve this watcher's counts (a watcher that keeps none is ignored)."""
        if isinstance(watcher, source.CountingWatcher):
            self._watchers.append(watcher)

    def totals(self) -> dict[str, dict[str, int]]:
        """Source → field → the sum over every attached watcher; every source and field present."""
        fields = [f.name for f in dataclasses.fields(source.WatcherCounts) if f.name != "source"]
        out = {s: dict.fromkeys(fields, 0) for s in SOURCES}
        for watcher in self._watchers:
            for counts in watcher.counters():
                row = out[counts.source]
                for name in fields:
                    row[name] += getattr(counts, name)
        return out

    def collect(self) -> Iterator[prom_core.Metric]:
        totals = self.totals()
        for field, name, doc in BY_SOURCE:
            family = prom_core.CounterMetricFamily(name, doc, labels=["source"])
            for src in SOURCES:
                family.add_metric([src], totals[src][field])
            yield family
        for field, name, doc in KMSG:
            yield prom_core.CounterMetricFamily(name, doc, value=totals["kmsg"][field])
