"""One duration grammar (``healer.durations``, Prometheus's) in rule files, rule windows and ``--since``."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import hypothesis
import hypothesis.strategies as st
import pytest

from healer import durations
from healer.feed import tail
from healer.rules import loader


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("500ms", 0.5),
        ("90s", 90.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("2d", 172800.0),
        ("1w", 604800.0),
        ("1y", 31536000.0),
        ("1y2w3d4h5m6s7ms", 31536000 + 2 * 604800 + 3 * 86400 + 4 * 3600 + 5 * 60 + 6.007),
        ("2m30s500ms", 150.5),
    ],
)
def test_prometheus_units_and_compound_forms_parse(text: str, seconds: float) -> None:
    assert durations.parse(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("1.5h", "no decimals (as in Prometheus); write 1h30m instead"),
        ("0.1s", "write 100ms instead"),
        ("30m1h", "largest first"),
        ("1h1h", "largest first"),
        ("90", "add a unit, such as 90s"),
        ("5 minutes", "units ms s m h d w y"),
        ("", "bad duration"),
        ("-5m", "bad duration"),
        ("1H", "bad duration"),
    ],
)
def test_text_outside_the_grammar_is_refused_with_what_to_write(text: str, hint: str) -> None:
    with pytest.raises(durations.DurationError, match=re.escape(hint)):
        durations.parse(text)


def test_yaml_values_are_the_grammar_or_a_number_of_seconds() -> None:
    assert durations.value("1h30m") == 5400.0
    assert durations.value(90) == 90.0
    for bad in (True, -1, None, [1]):
        with pytest.raises(durations.DurationError):
            durations.value(bad)


@hypothesis.given(st.integers(min_value=0, max_value=10**13))
def test_to_text_round_trips_through_parse_to_the_millisecond(ms: int) -> None:
    text = durations.to_text(ms / 1000)
    assert re.fullmatch(durations.PATTERN, text)
    assert round(durations.parse(text) * 1000) == ms


def _load(for_: str, window: str = "5m") -> list[str]:
    text = (
        "rules:\n  - id: r\n"
        f"    when: increase(ecc_sbe_volatile[{window}]) > 1\n"
        f"    for: {for_}\n    severity: warning\n"
        f"    resolve: {{for: {for_}}}\n"
    )
    result = loader.load_text(text, "r.yaml")
    return [str(d) for d in result.errors]


def test_rule_files_use_the_same_grammar_in_for_resolve_and_windows() -> None:
    assert _load("1y", window="1y") == []
    assert _load("1h30m", window="1d12h") == []
    result = loader.load_text(
        "rules:\n  - id: r\n    when: temp_c > 1\n    for: 1h30m\n    severity: info\n"
        "    resolve: {for: 1w}\n    cooldown: 1y\n"
    )
    assert result.ruleset is not None
    rule = result.ruleset.rules[0]
    assert (rule.for_s, rule.resolve_for_s, rule.cooldown_s) == (5400.0, 604800.0, 31536000.0)


def test_rule_files_refuse_what_the_grammar_refuses_with_the_same_hint() -> None:
    errors = _load("1.5h")
    assert any("write 1h30m instead" in e for e in errors), errors
    errors = _load("5m", window="30m1h")
    assert any("r.yaml:3:" in e and "largest first" in e for e in errors), errors


def test_since_uses_the_same_grammar() -> None:
    now = 1_800_000_000.0
    assert tail.parse_since("1y", now=now) == datetime.fromtimestamp(now - 31536000, tz=UTC)
    assert tail.parse_since("1d12h", now=now) == datetime.fromtimestamp(now - 129600, tz=UTC)
    with pytest.raises(ValueError, match=re.escape("write 1h30m instead")):
        tail.parse_since("1.5h", now=now)
    # a decimal number without a unit is unix seconds, not a duration
    assert tail.parse_since("1700000000.5", now=now) == datetime.fromtimestamp(1_700_000_000.5, tz=UTC)


def test_the_rule_schema_pattern_is_the_grammar() -> None:
    from healer.rules import spec

    assert spec.DURATION_PATTERN == durations.PATTERN
    for text in ("0", "1y", "1h30m", "500ms"):
        assert re.fullmatch(durations.PATTERN, text)
    for text in ("1.5h", "30m1h", "90", ""):
        assert not re.fullmatch(durations.PATTERN, text)


def test_every_severity_maps_to_alertmanager_and_pagerduty_in_order() -> None:
    from typing import get_args

    from healer.schemas import incidents

    levels = incidents.SEVERITY_LEVELS
    assert list(levels) == list(get_args(incidents.Severity))
    assert [lv.rank for lv in levels.values()] == [0, 1, 2, 3]
    assert [lv.alertmanager for lv in levels.values()] == ["info", "warning", "critical", "critical"]
    assert [lv.pagerduty for lv in levels.values()] == ["info", "warning", "error", "critical"]
    assert tail.SEVERITY_RANK == {"info": 0, "warning": 1, "major": 2, "critical": 3}
