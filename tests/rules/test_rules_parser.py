"""The expression language: precedence, types, scope checks, and safety on arbitrary input."""

from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import pytest

from healer import errors
from healer.rules import lexer, parser, tree
from healer.schemas import fields


def problems(src: str, scope: tree.Level = fields.Scope.GPU) -> list[tuple[str, int]]:
    return [(p.message, p.pos) for p in parser.parse(src, scope).problems]


def test_comparison_binds_tighter_than_not_and_not_tighter_than_and() -> None:
    root = parser.parse("not temp_c > 80 and power_w < 100").root
    assert isinstance(root, tree.Binary)
    assert root.op == "and"
    assert isinstance(root.left, tree.Unary)
    assert root.left.op == "not"
    assert isinstance(root.left.arg, tree.Binary)
    assert root.left.arg.op == ">"


def test_multiplication_binds_tighter_than_subtraction() -> None:
    root = parser.parse("temp_c > slowdown_temp_c - 2 * 3").root
    assert isinstance(root, tree.Binary)
    sub = root.right
    assert isinstance(sub, tree.Binary)
    assert sub.op == "-"
    assert isinstance(sub.right, tree.Binary)
    assert sub.right.op == "*"


def test_dcgm_alias_resolves_to_the_healer_metric() -> None:
    root = parser.parse("DCGM_FI_DEV_GPU_TEMP > 80").root
    assert isinstance(root, tree.Binary)
    assert isinstance(root.left, tree.Ref)
    assert root.left.name == "temp_c"


def test_range_function_keeps_metric_and_window() -> None:
    root = parser.parse("increase(ecc_dbe_volatile[1h30m]) > 0").root
    assert isinstance(root, tree.Binary)
    assert isinstance(root.left, tree.Call)
    rng = root.left.args[0]
    assert isinstance(rng, tree.Range)
    assert (rng.name, rng.window_s) == ("ecc_dbe_volatile", 5400.0)


def test_unknown_metric_is_reported_at_its_offset_with_a_suggestion() -> None:
    assert problems("power_w > 1 and tmp_c > 80") == [("unknown metric 'tmp_c' (did you mean 'temp_c'?)", 16)]


@pytest.mark.parametrize(
    ("src", "message"),
    [
        ("temp_c > 1 > 2", "comparisons do not chain"),
        ("", "empty expression"),
        ("temp_c >", "expected a number, metric or '('"),
        ("frobnicate(temp_c) > 1", "unknown function 'frobnicate'"),
        ("rate(temp_c[5m]) > 1", "rate() is for counters"),
        ("temp_c[5m] > 1", "needs a function such as rate()"),
        ("rate(ecc_dbe_volatile) > 1", "takes a range"),
        ("temp_c", "must be a condition"),
        ("temp_c and power_w", "'and' needs conditions"),
        ("rate(ecc_dbe_volatile[5x]) > 0", "expected a duration"),
        ("anomaly_score[5m] > 0", "keeps no history"),
        ("temp_c > 5m", "only goes inside [ ]"),
        ("__import__('os').system('x')", "unexpected character"),
        ("max(ecc_dbe_volatile[5m]) > 1", "for a window use max_over_time()"),
        ("count(temp_c) > 1", "count() counts GPUs"),
        ("absent(ecc_dbe_volatile[0s])", "longer than 0s"),
    ],
)
def test_mistakes_are_reported_not_raised(src: str, message: str) -> None:
    found = problems(src)
    assert any(message in m for m, _ in found), found


def test_node_scope_refuses_bare_gpu_metrics_but_accepts_aggregations() -> None:
    assert problems("temp_c > 80", fields.Scope.NODE) == [
        ("GPU metric 'temp_c' in a node-scope rule: aggregate it, e.g. max(temp_c)", 0)
    ]
    assert problems("count(temp_c > 80) >= 2 or max(rate(ecc_sbe_volatile[5m])) > 1", fields.Scope.NODE) == []
    assert problems("absent(telemetry[2m]) and gpus_missing > 0", fields.Scope.NODE) == []


def test_gpu_scope_may_compare_a_gpu_with_its_peers() -> None:
    assert problems("temp_c > avg(temp_c) + 15") == []


def test_durations_accept_compound_units() -> None:
    assert lexer.duration_value("1h30m") == 5400.0
    assert lexer.duration_value("500ms") == 0.5
    assert lexer.duration_value(90) == 90.0
    with pytest.raises(errors.RuleError, match="bad duration"):
        lexer.duration_value("5 minutes")


def test_windows_take_every_prometheus_unit_and_refuse_misordered_ones() -> None:
    assert problems("max_over_time(temp_c[1y]) > 1") == []
    assert problems("max_over_time(temp_c[1h30m]) > 1") == []
    assert [(m, pos) for m, pos in problems("max_over_time(temp_c[30m1h]) > 1") if "largest first" in m] == [
        ("bad duration '30m1h': units go largest first, each once (such as 1h30m, 1d12h)", 21)
    ]


@hypothesis.given(st.text(max_size=60))
@hypothesis.settings(max_examples=300, deadline=None)
def test_any_text_parses_or_reports_problems_without_raising(src: str) -> None:
    parsed = parser.parse(src)
    assert parsed.root is not None or parsed.problems
    for problem in parsed.problems:
        assert 0 <= problem.pos <= len(src)


@hypothesis.given(
    st.lists(
        st.sampled_from(
            [
                "temp_c",
                "power_w",
                "1",
                "2.5",
                "(",
                ")",
                "+",
                "-",
                "*",
                "/",
                ">",
                "<",
                "==",
                "and",
                "or",
                "not",
                "max(",
                "rate(ecc_dbe_volatile[1m])",
                ",",
            ]
        ),
        max_size=12,
    )
)
@hypothesis.settings(max_examples=300, deadline=None)
def test_token_soup_never_crashes_the_parser(tokens: list[str]) -> None:
    src = " ".join(tokens)
    parsed = parser.parse(src)
    assert parsed.root is not None or parsed.problems
