"""Log lines for frames dropped before they were ingested, with the counts the metric has.

Frames are dropped before ingest by the telemetry subscription's backlog (fair by node,
healer/bus/fair.py: a node's own oldest frames, or a full backlog), counted per subscription by the
bus. ``healer_controller_frames_dropped_total`` counts them; ``DropLog.report``
(every tick) writes ``controller.frames_dropped`` with ``dropped_total`` equal to that metric, at most
once per ``every_s`` while drops go on and once more when they stop, so the last line of a burst has
its final count.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class DropLog:
    def __init__(self, log: Any, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self.every_s = every_s
        self.clock = clock
        self._told = 0
        self._seen = 0
        self._at = -float("inf")

    def report(self, *, dropped: int, bad: int = 0) -> bool:
        """``dropped``: frames dropped so far (what the metric counts); ``bad``: frames counted bad so
        far (for context). Returns whether a line was written."""
        total = dropped
        growing = total > self._seen
        self._seen = total
        if total == self._told:
            return False
        now = self.clock()
        if growing and now - self._at < self.every_s:
            return False  # still dropping, and told recently: the next line carries it
        self._at = now
        since, self._told = total - self._told, total
        self.log.warning(
            "controller.frames_dropped", dropped_total=total, since_last=since, bad_total=bad,
            ended=not growing,
        )  # fmt: skip
        return True
