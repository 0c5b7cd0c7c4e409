"""The error vocabulary every layer speaks.

Adapters wrap third-party errors (``raise TemporaryError(...) from e``) so that callers decide on one
question only: is it worth trying again? ``TemporaryError`` says yes and after how long;
``PermanentError`` says no. ``DecodeError`` is what bad input on the wire becomes at the edge, and
``RuleError`` points at the place in a rule file that is wrong.
"""

from __future__ import annotations


class HealerError(Exception):
    """Base of every error healer raises on purpose."""


class TemporaryError(HealerError):
    """Worth retrying after ``delay`` seconds (a server away, a lease not yet expired, a 429)."""

    def __init__(self, message: str, *, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(HealerError):
    """Retrying will not help (bad configuration, refused by policy, a 404 that means gone)."""


class DecodeError(HealerError):
    """A message on the wire that is not a valid, known-version healer document.

    ``reason`` is a short, stable label used in metrics (``json``, ``schema_version``, ``validation``,
    ``too_large``); ``detail`` is the human-readable explanation.
    """

    def __init__(self, kind: str, reason: str, detail: str, fields: tuple[str, ...] = ()) -> None:
        super().__init__(f"bad {kind}: {reason}: {detail}")
        self.kind = kind
        self.reason = reason
        self.detail = detail
        self.fields = fields
        """Schema fields out of their bounds (``gpus.temp_c``), for per-field counts: only names the
        schema defines, never a name taken from the input."""


class RuleError(HealerError):
    """A mistake in a rule file, with the place it was found."""

    def __init__(self, message: str, *, path: str = "<string>", line: int = 0, col: int = 0) -> None:
        super().__init__(f"{path}:{line}:{col}: {message}")
        self.message = message
        self.path = path
        self.line = line
        self.col = col
