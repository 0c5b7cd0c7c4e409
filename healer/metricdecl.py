"""Metrics declared once, as class attributes, the way prometheus_client declares them at module level.

A process's metrics are a ``MetricSet`` subclass whose body lists each metric once, with its name,
help and labels::

    class AgentMetrics(metricdecl.MetricSet):
        frames_published = metricdecl.counter("healer_agent_frames_published_total", "NodeFrames published")
        commands = metricdecl.counter("healer_agent_commands_total", "commands handled", ["action", "status"])

``MetricSet(registry)`` registers every declaration on that registry (a fresh one by default), in the
order of the class body, and stores each metric on the instance under its attribute name, so the hot
path reads a plain instance attribute. Several sets can live in one process, each on its own registry
(several agents in one test process, a controller per shard). Adding a metric is one line in the body
(and, where a dashboard or alert reads it, the docs and deploy/ in the same change).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

import prometheus_client as prom

M = TypeVar("M")

Registry = prom.CollectorRegistry


class Declared(Generic[M]):
    """One metric of a ``MetricSet``: ``make`` builds and registers it on a registry. Reading it from an
    instance gives the metric (the instance holds it); from the class, the declaration."""

    def __init__(self, make: Callable[[Registry], M]) -> None:
        self.make = make
        self.attr = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Declared[M]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> M: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Declared[M] | M:
        if obj is None:
            return self
        raise AttributeError(f"{self.attr}: declared, not yet registered (MetricSet.__init__ does it)")


def counter(name: str, documentation: str, labels: Sequence[str] = ()) -> Declared[prom.Counter]:
    return Declared(lambda r: prom.Counter(name, documentation, labels, registry=r))


def gauge(name: str, documentation: str, labels: Sequence[str] = ()) -> Declared[prom.Gauge]:
    return Declared(lambda r: prom.Gauge(name, documentation, labels, registry=r))


def histogram(
    name: str, documentation: str, buckets: Sequence[float], labels: Sequence[str] = ()
) -> Declared[prom.Histogram]:
    return Declared(lambda r: prom.Histogram(name, documentation, labels, buckets=buckets, registry=r))


def declarations(cls: type) -> Iterator[tuple[str, Declared[Any]]]:
    """A set's declarations, base classes first, each in the order of its class body (a subclass's
    declaration of a name replaces its base's)."""
    found: dict[str, Declared[Any]] = {}
    for klass in reversed(cls.__mro__):
        found.update((attr, value) for attr, value in vars(klass).items() if isinstance(value, Declared))
    yield from found.items()


class MetricSet:
    """Registers every ``Declared`` of its class on ``registry`` (a fresh one when None)."""

    def __init__(self, registry: Registry | None = None) -> None:
        self.registry = registry or prom.CollectorRegistry()
        for attr, declared in declarations(type(self)):
            self.__dict__[attr] = declared.make(self.registry)
