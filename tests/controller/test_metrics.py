"""The controller's batched lag histogram scrapes exactly like prometheus_client's own Histogram."""

from __future__ import annotations

import prometheus_client as prom
from hypothesis import given
from hypothesis import strategies as st

from healer.controller.observability import metrics

BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


def scrape(registry: prom.CollectorRegistry, name: str) -> list[tuple[str, str, float]]:
    return sorted(
        (s.name, repr(sorted(s.labels.items())), round(s.value, 6))
        for family in registry.collect()
        if family.name == name
        for s in family.samples
        if not s.name.endswith("_created")
    )


@given(st.lists(st.sampled_from([0.0, *BUCKETS, 0.3, 7.5, 1e6]) | st.floats(0, 100), max_size=60))
def test_folded_batches_scrape_like_a_prometheus_histogram(values: list[float]) -> None:
    ours_registry, reference_registry = prom.CollectorRegistry(), prom.CollectorRegistry()
    ours = metrics.BatchedHistogram("lag_seconds", "lag", BUCKETS, registry=ours_registry)
    reference = prom.Histogram("lag_seconds", "lag", buckets=BUCKETS, registry=reference_registry)
    half = len(values) // 2
    for batch in (values[:half], values[half:]):
        for v in batch:
            ours.observe(v)
            reference.observe(v)
        ours.fold()
    assert ours.pending == []
    assert scrape(ours_registry, "lag_seconds") == scrape(reference_registry, "lag_seconds")


def test_observations_show_after_the_fold_not_before() -> None:
    registry = prom.CollectorRegistry()
    lag = metrics.BatchedHistogram("lag_seconds", "lag", BUCKETS, registry=registry)
    lag.observe(0.2)
    assert registry.get_sample_value("lag_seconds_count") == 0
    lag.fold()
    assert registry.get_sample_value("lag_seconds_count") == 1
    assert registry.get_sample_value("lag_seconds_bucket", {"le": "0.25"}) == 1
    assert registry.get_sample_value("lag_seconds_bucket", {"le": "0.1"}) == 0
