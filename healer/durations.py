"""Durations, one grammar everywhere: rule files (``for``, ``resolve.for``, ``cooldown``, range windows
``[10m]``), rule tests, and CLI flags such as ``healer incidents tail --since``.

The grammar is Prometheus's (``model.ParseDuration``), so that what works in a Prometheus rule works in
a healer rule and the other way round: integers with the units ``ms s m h d w y`` (``y`` = 365 days,
``w`` = 7 days), several combined largest unit first, each unit at most once (``1h30m``, ``1d12h``,
``2m30s500ms``), or ``0`` alone.

No decimals: ``1.5h`` is refused, as Prometheus refuses it, with the compound form to write instead
(``1h30m``). Accepting decimals would let a healer rule hold a window Prometheus cannot express, and the
compound form says the same thing exactly (to the millisecond) without rounding questions.

In YAML a bare number (``for: 90``) is a number of seconds; that is a YAML number, not this grammar.
"""

from __future__ import annotations

import re
from typing import Final

UNITS_S: Final = {
    "y": 365 * 86400.0,
    "w": 7 * 86400.0,
    "d": 86400.0,
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 0.001,
}
"""Seconds per unit, largest first (the order units must appear in)."""
_MS: Final = {unit: round(s * 1000) for unit, s in UNITS_S.items()}

TOKEN: Final = r"(?:\d+(?:ms|y|w|d|h|m|s))+"
"""What a tokenizer takes as one duration; ``parse`` then checks the order of the units."""

PATTERN: Final = r"^(?:0|(?=\d)(?:\d+y)?(?:\d+w)?(?:\d+d)?(?:\d+h)?(?:\d+m)?(?:\d+s)?(?:\d+ms)?)$"
"""The whole grammar as one regular expression (for JSON Schema)."""

HELP: Final = "a duration such as 30s, 5m, 1h30m, 2d, 1y (units ms s m h d w y, largest first)"

_FULL = re.compile(PATTERN)
_PART = re.compile(r"(\d+)(ms|y|w|d|h|m|s)")
_DECIMAL = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|y|w|d|h|m|s))+$")
_DECIMAL_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|y|w|d|h|m|s)")


class DurationError(ValueError):
    """Text that is not a duration; the message says what to write instead."""


def parse(text: str) -> float:
    """``'1h30m'`` → 5400.0 seconds; raises ``DurationError`` for anything outside the grammar."""
    text = text.strip()
    if _FULL.match(text):
        return float(sum(int(n) * _MS[unit] for n, unit in _PART.findall(text))) / 1000.0
    raise DurationError(_explain(text))


def value(raw: object) -> float:
    """A duration from a YAML document: a string in the grammar, or a non-negative number of seconds."""
    if isinstance(raw, bool):
        raise DurationError(f"bad duration {raw!r}: use {HELP}")
    if isinstance(raw, int | float):
        if raw < 0:
            raise DurationError(f"negative duration {raw}")
        return float(raw)
    if isinstance(raw, str):
        return parse(raw)
    raise DurationError(f"bad duration {raw!r}: use a string such as 30s, 5m, 1h")


def looks_like(text: str) -> bool:
    """Whether ``text`` was meant as a duration (digits and units, decimals included), right or wrong."""
    return bool(_DECIMAL.match(text.strip()))


def to_text(seconds: float) -> str:
    """Seconds in the grammar, largest units first, to the millisecond: 5400 → ``1h30m``, 0 → ``0``."""
    left = round(seconds * 1000)
    if left < 0:
        raise DurationError(f"negative duration {seconds}")
    parts = []
    for unit, ms in _MS.items():
        n, left = divmod(left, ms)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts) or "0"


def _explain(text: str) -> str:
    if _DECIMAL.match(text) and "." in text:
        seconds = sum(float(n) * UNITS_S[u] for n, u in _DECIMAL_PART.findall(text))
        return f"bad duration {text!r}: no decimals (as in Prometheus); write {to_text(seconds)} instead"
    if _DECIMAL.match(text):
        return f"bad duration {text!r}: units go largest first, each once (such as 1h30m, 1d12h)"
    if text.isdigit():
        return f"bad duration {text!r}: add a unit, such as {text}s"
    return f"bad duration {text!r}: use {HELP}"
