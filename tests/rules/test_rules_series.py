"""promtool series notation."""

from __future__ import annotations

import pytest

from healer.rules import series


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("70x2 86x1", [70.0, 70.0, 70.0, 86.0, 86.0]),
        ("0+10x3", [0.0, 10.0, 20.0, 30.0]),
        ("5-1x2", [5.0, 4.0, 3.0]),
        ("_ 1 _x2", [None, 1.0, None, None]),
        ("1.5e2", [150.0]),
        ("true false", [1.0, 0.0]),
        (42, [42.0]),
    ],
)
def test_series_expands_like_promtool(text: str | int, expected: list[float | None]) -> None:
    assert series.expand(text) == expected


@pytest.mark.parametrize("text", ["abc", "1+x3", "1+2", "1x", "_y2"])
def test_bad_series_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError, match="bad series run"):
        series.expand(text)
