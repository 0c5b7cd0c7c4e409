"""Live reliability on ``/metrics`` (#42, item 4): repair times and times between failures as histograms,
and the fleet health score as a gauge, with the definitions of ``healer report`` (docs/archive.md).

- ``healer_controller_repair_seconds{rule,kind}``: a fault incident's open to resolved, observed when it
  resolves (``kind``: ``gpu``, ``node`` or ``port``).
- ``healer_controller_time_between_failures_seconds{kind}``: when a fault incident opens, the time since
  the same GPU's (a node's own incidents: the node's; a port's: the port's) previous one opened. The
  previous openings are this process's memory (``MAX_REMEMBERED`` GPUs, the least recent forgotten
  first): after a restart or a failover the first failure of each GPU has nothing to compare with and is
  not observed.
- ``healer_controller_fleet_health_score``: 100 x (1 - the severity-weighted share of the fleet's GPUs
  an open fault incident holds), at each tick: ``healer report``'s score at this instant. A GPU under
  several incidents counts once, at the highest weight; a node incident holds its node's GPUs. The
  fleet is this controller's admitted nodes x ``controller.gpus_per_node`` (with shards: its shard).

Not faults, as in the report: the circuit breaker's, shared-cause and power-budget incidents; hardware
replacements are follow-ups (no repair or failure of their own) but hold their GPU in the score.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Final, Protocol

from healer.archive import figures
from healer.controller.observability import metrics as controller_metrics
from healer.schemas import incidents

MAX_REMEMBERED: Final = 500_000
"""GPUs (or nodes, or ports) whose last fault opening is remembered for the time between failures."""
NOT_FAULTS: Final = figures.NOT_FAULTS
NOT_NEW_FAILURES: Final = figures.NOT_FAULTS | figures.FOLLOW_UPS


class Held(Protocol):
    """What the meter reads of an incident (``book.Incident``)."""

    rule_id: str
    severity: incidents.Severity
    node: str
    gpu_index: int | None
    port: str | None
    evidence: dict[str, float | int | str | bool | None]
    opened_at: float


def kind_of(inc: Held) -> str:
    if inc.port is not None:
        return "port"
    return "node" if inc.gpu_index is None else "gpu"


def _gpus(inc: Held, node_gpus: int) -> list[tuple[str, str]]:
    """The (node, GPU) keys an incident holds; a port is a GPU of its own."""
    if inc.port is not None:
        return [(inc.node, f"port:{inc.port}")]
    if inc.gpu_index is not None:
        return [(inc.node, str(inc.gpu_index))]
    count = figures.node_gpus_of(inc.evidence, node_gpus)
    return [(inc.node, str(g)) for g in range(count)]


KINDS: Final = ("gpu", "node", "port")


def start_at_zero(metrics: controller_metrics.ControllerMetrics, rules: Iterable[tuple[str, str]]) -> None:
    """The repair histogram's series of every loaded rule (``(rule id, scope)``) at zero, so a healthy
    fleet's dashboard shows zeros rather than "No data" (called as rules load)."""
    for rule_id, scope in rules:
        if rule_id not in NOT_NEW_FAILURES and scope in KINDS:
            metrics.repair_seconds.labels(rule_id, scope)


class RepairMeter:
    def __init__(self, metrics: controller_metrics.ControllerMetrics, node_gpus: int) -> None:
        self.metrics = metrics
        self.node_gpus = node_gpus
        self.last_opened: collections.OrderedDict[tuple[str, str], float] = collections.OrderedDict()

    def opened(self, inc: Held) -> None:
        if inc.rule_id in NOT_NEW_FAILURES:
            return
        kind = kind_of(inc)
        key = (inc.node, inc.port or ("node" if inc.gpu_index is None else str(inc.gpu_index)))
        before = self.last_opened.pop(key, None)
        if before is not None and inc.opened_at >= before:
            self.metrics.time_between_failures.labels(kind).observe(inc.opened_at - before)
        self.last_opened[key] = inc.opened_at
        while len(self.last_opened) > MAX_REMEMBERED:
            self.last_opened.popitem(last=False)

    def resolved(self, inc: Held, resolved_at: float) -> None:
        if inc.rule_id in NOT_NEW_FAILURES or resolved_at < inc.opened_at:
            return
        self.metrics.repair_seconds.labels(inc.rule_id, kind_of(inc)).observe(resolved_at - inc.opened_at)

    def health(self, open_incidents: Iterable[Held], fleet_gpus: int) -> float | None:
        """Set and return the score (None, and the gauge untouched, without a fleet)."""
        if fleet_gpus <= 0:
            return None
        weight: dict[tuple[str, str], float] = {}
        for inc in open_incidents:
            if inc.rule_id in NOT_FAULTS:
                continue
            w = figures.SEVERITY_WEIGHT[inc.severity]
            for key in _gpus(inc, self.node_gpus):
                weight[key] = max(w, weight.get(key, 0.0))
        score = max(0.0, 100 * (1 - sum(weight.values()) / fleet_gpus))
        self.metrics.fleet_health_score.set(score)
        return score
