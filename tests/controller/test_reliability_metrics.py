"""Live reliability on the controller's /metrics (#42, item 4): the repair-time and time-between-failures
histograms and the fleet health score gauge, with the report's definitions; and end to end on a real
nats-server, a fault's incident observed as it opens and resolves."""

from __future__ import annotations

import dataclasses

import prometheus_client as prom
import pytest

from healer import testing
from healer.archive import figures
from healer.controller.observability import metrics as controller_metrics
from healer.controller.observability import repairs
from healer.schemas import incidents
from tests.controller.conftest import Fleet, Harness, metric, run_until, warm


@dataclasses.dataclass
class Inc:
    rule_id: str
    severity: incidents.Severity
    node: str
    gpu_index: int | None
    opened_at: float
    port: str | None = None
    evidence: dict[str, float | int | str | bool | None] = dataclasses.field(default_factory=dict)


def meter() -> tuple[repairs.RepairMeter, controller_metrics.ControllerMetrics]:
    m = controller_metrics.ControllerMetrics(prom.CollectorRegistry())
    return repairs.RepairMeter(m, node_gpus=8), m


def test_repairs_and_times_between_failures_are_observed_for_faults_only() -> None:
    rm, m = meter()
    first, again = Inc("ecc", "critical", "n1", 0, 1000.0), Inc("ecc", "critical", "n1", 0, 1000.0 + 7200)
    rm.opened(first)
    rm.resolved(first, 1000.0 + 1800)
    rm.opened(again)  # the same GPU, 2 h later
    rm.opened(Inc("ecc", "critical", "n1", 1, 9000.0))  # another GPU: its first failure here
    for other in (figures.BREAKER_RULE, figures.SHARED_CAUSE_RULE, figures.REPLACEMENT_RULE):
        inc = Inc(other, "critical", "n1", 0, 9500.0)
        rm.opened(inc)
        rm.resolved(inc, 9600.0)
    assert metric(m, "repair_seconds_count", rule="ecc", kind="gpu") == 1
    assert metric(m, "repair_seconds_sum", rule="ecc", kind="gpu") == 1800
    assert metric(m, "repair_seconds_bucket", rule="ecc", kind="gpu", le="1800.0") == 1
    assert metric(m, "repair_seconds_bucket", rule="ecc", kind="gpu", le="900.0") == 0
    assert metric(m, "time_between_failures_seconds_count", kind="gpu") == 1
    assert metric(m, "time_between_failures_seconds_sum", kind="gpu") == 7200
    assert metric(m, "repair_seconds_count", rule=figures.REPLACEMENT_RULE, kind="gpu") == 0


def test_the_fleet_health_score_weighs_each_gpu_once_by_its_worst_open_incident() -> None:
    rm, m = meter()
    open_now = [
        Inc("ecc", "critical", "n1", 0, 0.0),  # n1/gpu0: weight 1
        Inc("silent", "major", "n1", None, 0.0, evidence={"gpus_expected": 4}),  # n1's 4 GPUs: 2/3 each,
        Inc("hot", "warning", "n2", 3, 0.0),  # but gpu0 already counts 1; n2/gpu3: 1/3
        Inc(figures.BREAKER_RULE, "critical", "fleet", None, 0.0),  # no fault
    ]
    held = 1 + 3 * 2 / 3 + 1 / 3
    assert rm.health(open_now, 32) == pytest.approx(100 * (1 - held / 32))
    assert metric(m, "fleet_health_score") == pytest.approx(100 * (1 - held / 32))
    assert rm.health([], 32) == 100
    assert rm.health(open_now, 0) is None, "no fleet, no score"


async def test_a_controllers_incident_is_measured_as_it_opens_and_resolves(harness: Harness) -> None:
    actuator = testing.RecordingActuator()
    ctl = await harness.controller(actuator, gpus_per_node=2)
    fleet = Fleet(harness.bus, ["n1", "n2"])
    await warm(fleet)
    await run_until(fleet, lambda: metric(ctl.metrics, "fleet_health_score") == 100)  # 2 nodes x 2 GPUs
    started = ctl.metrics.registry.get_sample_value(
        "healer_controller_repair_seconds_count", {"rule": "ecc-dbe", "kind": "gpu"}
    )
    assert started == 0, "every loaded rule's series exists at zero, so a dashboard shows 0, not No data"
    fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 1}
    await run_until(fleet, lambda: "action" in harness.feed.changes())
    # one critical GPU of 4 admitted: 100 x (1 - 1/4)
    await run_until(fleet, lambda: metric(ctl.metrics, "fleet_health_score") == 75)
    fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 0}
    await run_until(fleet, lambda: "resolved" in harness.feed.changes("n1"))
    resolved = next(e for e in harness.feed.events if e.change == "resolved")
    opened = next(e for e in harness.feed.events if e.change == "opened")
    assert metric(ctl.metrics, "repair_seconds_count", rule="ecc-dbe", kind="gpu") == 1
    took = (resolved.time - opened.time).total_seconds()
    assert metric(ctl.metrics, "repair_seconds_sum", rule="ecc-dbe", kind="gpu") == pytest.approx(
        took, abs=0.5
    )
    await run_until(fleet, lambda: metric(ctl.metrics, "fleet_health_score") == 100)
