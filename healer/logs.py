"""Logging setup: structlog everywhere, JSON lines when not on a terminal, bound context as fields.

Call ``configure`` once in a process's entry point (the CLI does). Library code only ever does
``log = structlog.get_logger(__name__)`` and ``log.info("event.name", key=value)``: the event name is a
stable dotted identifier and the data are fields, so logs can be queried and tests can assert on them.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    out = stream or sys.stderr
    as_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )


class Throttle:
    """Rate-limited logging: ``allow(key)`` is True at most once per ``every_s`` per key, and says how
    many calls were held back since the last True (``suppressed``)."""

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self._last: dict[Any, float] = {}
        self.suppressed: dict[Any, int] = {}

    def allow(self, key: Any) -> bool:
        now = self.clock()
        if now - self._last.get(key, -float("inf")) >= self.every_s:
            self._last[key] = now
            return True
        self.suppressed[key] = self.suppressed.get(key, 0) + 1
        return False

    def take_suppressed(self, key: Any) -> int:
        return self.suppressed.pop(key, 0)
