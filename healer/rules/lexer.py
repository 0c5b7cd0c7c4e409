"""Tokens of the rule expression language. Durations (``90s``, ``5m``, ``1h30m``) are ``healer.durations``.

The tokenizer is a single regular expression over the ``when`` string; every token keeps its offset so
an error points at the exact column in the rule file.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

from healer import durations, errors

TokenKind = Literal["num", "dur", "ident", "op", "end"]

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<dur>"""
    + durations.TOKEN
    + r"""(?![A-Za-z0-9_.]))
  | (?P<num>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<=|>=|&&|\|\||[-+*/%<>()\[\],!])
    """,
    re.VERBOSE,
)


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


def duration_value(value: object) -> float:
    """``durations.value`` raising ``RuleError`` (without a place), for callers that report rule errors."""
    try:
        return durations.value(value)
    except durations.DurationError as e:
        raise errors.RuleError(str(e)) from None
