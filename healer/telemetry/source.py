"""The TelemetrySource Protocol every reading source implements, and what it hands back.

A source is synchronous and cheap to call once per interval; the agent calls it from a worker thread,
so a slow NVML call never blocks the event loop. ``sample()`` returns the GPUs it could read and the
events it noticed while reading (a GPU lost, an NVML error); it never raises for one bad GPU.
Power control lives here too because it is the same device handle: the agent's command executor uses
``power_limits`` and ``set_power_limit`` and nothing else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from healer.schemas import events, telemetry


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    gpus: list[telemetry.GpuSample]
    events: list[events.NodeEvent] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True)
class PowerLimits:
    """One GPU's power-limit envelope, in watts."""

    current_w: float
    default_w: float
    min_w: float
    max_w: float


class TelemetrySource(Protocol):
    kind: telemetry.Source
    """``nvml`` or ``sim``: goes into every frame's ``source``."""
    gpus_expected: int | None
    """GPUs this node should have (configured, else what ``open()`` found); frames carry it."""

    def open(self) -> None:
        """Acquire the devices (nvmlInit). Raises errors.PermanentError if there is nothing to read."""

    def close(self) -> None:
        """Release the devices; safe to call twice."""

    def sample(self) -> Sample:
        """Read every GPU once."""

    def power_limits(self, index: int) -> PowerLimits:
        """Current, default, min and max power limit of one GPU (errors.TemporaryError if unreadable)."""

    def set_power_limit(self, index: int, watts: float) -> None:
        """Set one GPU's power limit (already clamped by the caller). Raises HealerError subclasses."""


EventSink = Callable[[events.NodeEvent], None]
"""Where a watcher thread hands events; must be thread-safe (the agent uses call_soon_threadsafe)."""


class EventWatcher(Protocol):
    """Something that notices events between samples (the NVML XID watcher)."""

    def start(self, sink: EventSink) -> None: ...

    def stop(self) -> None: ...


@dataclasses.dataclass(slots=True)
class WatcherCounts:
    """What one watcher has done since it was built: the numbers an SRE needs to trust it (served on
    the agent's /metrics). Each field is written by one thread and read by the scrape."""

    source: events.EventSource
    events: int = 0
    """Events handed on (XIDs, SXIDs, double-bit ECC; for NVML also a failed wait's GPU-lost event)."""
    duplicates: int = 0
    """XIDs of this source dropped because another report of the same fault was passed (watchers.py)."""
    parse_failures: int = 0
    """What the watcher could not read: a kernel-log line naming an Xid or SXid in no known format, an
    NVML event of a type it does not know."""
    failures: int = 0
    """Reads or waits that failed (an unreadable /dev/kmsg, an NVML wait error), not counting timeouts
    and kmsg overruns."""
    records: int = 0
    """Kernel-log records read, every subsystem's (kmsg only)."""
    overruns: int = 0
    """kmsg reads that failed with EPIPE: records the kernel overwrote before they were read."""
    skipped: int = 0
    """kmsg records skipped because the agent had handled them already (no replay after a restart)."""
    reopens: int = 0
    """Times the kernel log was opened again after a read failed."""


@runtime_checkable
class CountingWatcher(EventWatcher, Protocol):
    """A watcher that keeps WatcherCounts; a combined one hands on those of every watcher in it."""

    def counters(self) -> list[WatcherCounts]: ...
