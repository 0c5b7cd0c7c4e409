"""promtool's series notation for rule unit tests: ``'70x6 86x12'``, ``'0+10x5'``, ``'_x3 1'``.

``a+bxn`` is a, a+b, ..., a+n*b (n+1 samples); ``a-bxn`` counts down; ``axn`` repeats a (n+1 samples);
``_`` is one missing sample and ``_xn`` is n of them; a bare number is one sample. Runs are separated by
spaces. ``true``/``false`` read as 1/0.
"""

from __future__ import annotations

import re

_RUN = re.compile(
    r"^(?P<a>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|true|false)"
    r"(?:(?P<sign>[-+])(?P<b>\d+\.?\d*(?:[eE][-+]?\d+)?))?(?:x(?P<n>\d+))?$"
)
_BLANK = re.compile(r"^_(?:x(?P<n>\d+))?$")


def expand(text: str | float | int) -> list[float | None]:
    """The samples a series string stands for (``None`` = no sample). Raises ValueError."""
    if isinstance(text, bool):
        return [float(text)]
    if isinstance(text, int | float):
        return [float(text)]
    out: list[float | None] = []
    for run in str(text).split():
        blank = _BLANK.match(run)
        if blank:
            out += [None] * int(blank.group("n") or 1)
            continue
        m = _RUN.match(run)
        if m is None:
            raise ValueError(f"bad series run {run!r}: use a, axn, a+bxn, a-bxn, _ or _xn")
        a_text = m.group("a")
        a = {"true": 1.0, "false": 0.0}.get(a_text)
        a = float(a_text) if a is None else a
        b = float(m.group("b") or 0) * (-1 if m.group("sign") == "-" else 1)
        if m.group("n") is None:
            if m.group("b") is not None:
                raise ValueError(f"bad series run {run!r}: a+b needs a count, as in a+bxn")
            out.append(a)
            continue
        out += [a + b * i for i in range(int(m.group("n")) + 1)]
    return out
