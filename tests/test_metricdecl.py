"""Metrics declared once (#40): a ``MetricSet``'s class body is the whole list of its metrics."""

from __future__ import annotations

import prometheus_client as prom
import pytest

from healer import metricdecl
from healer.agent import exposition
from healer.controller.observability import metrics


class Base(metricdecl.MetricSet):
    seen = metricdecl.counter("toy_seen_total", "things seen", ["kind"])
    depth = metricdecl.gauge("toy_depth", "queue depth")


class Toy(Base):
    wait = metricdecl.histogram("toy_wait_seconds", "time waited", (0.1, 1.0))
    depth = metricdecl.gauge("toy_depth_items", "queue depth, renamed by the subclass")


def test_each_declaration_is_registered_once_per_set_on_its_registry() -> None:
    one, two = Toy(), Toy()
    one.seen.labels("a").inc()
    assert one.registry is not two.registry
    assert one.registry.get_sample_value("toy_seen_total", {"kind": "a"}) == 1.0
    assert two.registry.get_sample_value("toy_seen_total", {"kind": "a"}) is None
    names = [m.name for m in one.registry.collect()]
    assert names == ["toy_seen", "toy_depth_items", "toy_wait_seconds"], "base first, class body order"
    assert isinstance(one.wait, prom.Histogram)


def test_a_declaration_read_from_the_class_is_the_declaration_and_from_an_unregistered_set_an_error() -> None:
    assert isinstance(Toy.seen, metricdecl.Declared)
    bare = Toy.__new__(Toy)
    with pytest.raises(AttributeError, match="not yet registered"):
        _ = bare.seen


def test_a_registry_given_is_used_and_a_second_set_on_it_is_refused_as_a_duplicate() -> None:
    registry = prom.CollectorRegistry()
    assert Toy(registry).registry is registry
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Toy(registry)


@pytest.mark.parametrize("cls", [metrics.ControllerMetrics, exposition.AgentMetrics])
def test_every_metric_of_the_processes_is_a_declaration(cls: type[metricdecl.MetricSet]) -> None:
    """The controller's and the agent's constructors only start label sets at zero and attach scrape-time
    collectors: every prometheus_client metric they hold was declared in the class body."""
    instance = cls()
    held = {k for k, v in vars(instance).items() if isinstance(v, prom.metrics.MetricWrapperBase)}
    declared = {name for name, _ in metricdecl.declarations(cls)}
    assert held
    assert held <= declared
