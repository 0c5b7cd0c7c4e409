"""Log lines for things that come in floods (malformed frames, fetch failures), at a bounded rate.

A flood of bad messages once produced 227 MB of log in 10 s, one line each, which deepened the overload
that caused it. ``Throttled.note`` counts every occurrence (the caller counts them in metrics too) and
logs at most one line per ``every_s``: the first at once, then each later line carries how many of each
reason came since the previous one (``since_last``) and how many in all (``total``, what the metric
counts), so nothing is hidden and the log stays small. ``flush`` (every tick) writes the counts still
untold once ``every_s`` has passed, so the last line of a burst says how it ended.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any


class Throttled:
    def __init__(
        self, log: Any, event: str, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.log = log
        self.event = event
        self.every_s = every_s
        self.clock = clock
        self._since: collections.Counter[str] = collections.Counter()
        self._at = -float("inf")
        self.totals: collections.Counter[str] = collections.Counter()
        """Every occurrence noted, by reason (as the metrics count them)."""
        self._last: tuple[str, dict[str, Any]] = ("", {})

    @property
    def total(self) -> int:
        return sum(self.totals.values())

    def note(self, reason: str, count: int = 1, **fields: Any) -> bool:
        """Count one (or ``count`` tallied elsewhere); log it (with the counts since the last line) if
        none was logged within ``every_s``. Returns whether a line was written."""
        self._since[reason] += count
        self.totals[reason] += count
        self._last = (reason, fields)
        if self.clock() - self._at < self.every_s:
            return False
        self._write(reason, fields)
        return True

    def flush(self) -> bool:
        """Write the counts noted since the last line, if any and ``every_s`` has passed."""
        if not self._since or self.clock() - self._at < self.every_s:
            return False
        self._write(*self._last)
        return True

    def _write(self, reason: str, fields: dict[str, Any]) -> None:
        self._at = self.clock()
        since, self._since = dict(self._since), collections.Counter()
        self.log.warning(self.event, reason=reason, since_last=since, total=dict(self.totals), **fields)
