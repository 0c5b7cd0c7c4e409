"""Tokens of the rule expression language, and durations (``90s``, ``5m``, ``1h30m``).

The tokenizer is a single regular expression over the ``when`` string; every token keeps its offset so
an error points at the exact column in the rule file.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Final, Literal

from healer import errors

TokenKind = Literal["num", "dur", "ident", "op", "end"]

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<dur>(?:\d+(?:ms|s|m|h|d|w))+(?![A-Za-z0-9_.]))
  | (?P<num>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<=|>=|&&|\|\||[-+*/%<>()\[\],!])
    """,
    re.VERBOSE,
)

_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")
UNIT_S: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w))+$")


@dataclasses.dataclass(frozen=True, slots=True)
class Token:
    kind: TokenKind
    text: str
    pos: int

    @property
    def end(self) -> int:
        return self.pos + len(self.text)


class SyntaxProblem(Exception):
    """A syntax error at an offset inside the expression (the loader turns it into a RuleError)."""

    def __init__(self, message: str, pos: int) -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos


def tokenize(src: str) -> list[Token]:
    out: list[Token] = []
    pos = 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if m is None:
            raise SyntaxProblem(f"unexpected character {src[pos]!r}", pos)
        kind = m.lastgroup
        if kind != "ws":
            assert kind in ("num", "dur", "ident", "op")
            out.append(Token(kind, m.group(), pos))  # type: ignore[arg-type]
        pos = m.end()
    out.append(Token("end", "", len(src)))
    return out


def parse_duration(text: str) -> float:
    """``'1h30m'`` → 5400.0 seconds. Raises RuleError (without a place) when malformed."""
    text = text.strip()
    if not _DURATION.match(text):
        raise errors.RuleError(f"bad duration {text!r}: use a number with a unit, such as 30s, 5m, 1h30m")
    return sum(int(n) * UNIT_S[unit] for n, unit in _DURATION_PART.findall(text))


def duration_value(value: object) -> float:
    """A YAML duration: a string with units, or a bare number of seconds."""
    if isinstance(value, bool):
        raise errors.RuleError(f"bad duration {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise errors.RuleError(f"negative duration {value}")
        return float(value)
    if isinstance(value, str):
        return parse_duration(value)
    raise errors.RuleError(f"bad duration {value!r}: use a string such as 30s, 5m, 1h")


def format_duration(seconds: float) -> str:
    if seconds and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"
