"""The agent's share of an XID's path (#43 item 2), at the one place it can wait: ``watchers.Combined``,
which holds an NVML XID up to ``xid_log_wait_s`` (1 s) for the kernel log's line of the same fault.

The real ``Combined`` between two stand-in watchers (the NVML event thread and the kernel-log reader
call its ``offer`` exactly as theirs do); for each kernel-line delay, 200 fatal XIDs on distinct GPUs and
codes, each timed from the NVML callback to the agent's sink (where the agent publishes), with the hold
(1 s, the default) and without (0). Also: whether what was published carries the kernel line (the
process and registers the incident's evidence needs).

    nice -n 10 .venv/bin/python benchmarks/xid_hold.py

No GPU, no agent process: the NVML callback is the stand-in's call. What it measures is the hold's own
cost and what each choice publishes; the controller's share is ``healer bench controller``'s XID figure.
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import threading
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import structlog

from healer.schemas import events
from healer.telemetry import watchers

CODES = (48, 64, 74, 79, 95, 119, 120, 140)


class Feed:
    """A watcher that calls the sink when told to (the NVML event thread, the kernel log reader)."""

    def __init__(self) -> None:
        self.sink: Any = None

    def start(self, sink: Any) -> None:
        self.sink = sink

    def stop(self) -> None:
        pass


def measure(hold_s: float, line_delay_s: float | None, count: int = 200) -> tuple[list[float], int]:
    """Latencies (s) from the NVML callback to the sink, and how many published events were the kernel's."""
    nvml, kmsg = Feed(), Feed()
    got: dict[tuple[int, int], tuple[float, events.NodeEvent]] = {}
    arrived = threading.Condition()

    def sink(event: events.NodeEvent) -> None:
        with arrived:
            got.setdefault((event.gpu_index or 0, event.xid or 0), (time.perf_counter(), event))
            arrived.notify_all()

    combined = watchers.Combined([nvml, kmsg], window_s=5.0, hold_s=hold_s)
    combined.start(sink)
    latencies = []
    for k in range(count):
        key = (k // len(CODES), CODES[k % len(CODES)])
        t0 = time.perf_counter()
        nvml.sink(events.new("n1", "xid", gpu_index=key[0], xid=key[1], source="nvml"))
        if line_delay_s is not None:
            text = "NVRM: Xid (PCI:0000:18:00): 48, pid=4242"
            line = events.new(
                "n1",
                "xid",
                gpu_index=key[0],
                xid=key[1],
                source="kmsg",
                pid=4242,
                process="python3",
                message=text,
            )
            threading.Timer(line_delay_s, kmsg.sink, (line,)).start()
        with arrived:
            arrived.wait_for(lambda key=key: key in got, timeout=5.0)  # type: ignore[misc]
        latencies.append(got[key][0] - t0)
        time.sleep(line_delay_s or 0.0)  # the late kernel line lands before the next fault
    combined.stop()
    return latencies, sum(e.source == "kmsg" for _, e in got.values())


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    print("NVML callback -> agent publish, 200 fatal XIDs per row (watchers.Combined, real code)")
    print(f"{'hold':>6} {'kernel line after':>18} {'p50 ms':>8} {'p99 ms':>8} {'with the kernel line':>32}")
    for hold in (1.0, 0.0):
        for delay in (0.001, 0.02, None):
            lat, with_line = measure(hold, delay)
            q = statistics.quantiles(lat, n=100)
            after = "never" if delay is None else f"{delay * 1000:g} ms"
            print(
                f"{hold:>5g}s {after:>18} {statistics.median(lat) * 1000:>8.1f} {q[98] * 1000:>8.1f}"
                f" {with_line:>28}/{len(lat)}"
            )


if __name__ == "__main__":
    main()
