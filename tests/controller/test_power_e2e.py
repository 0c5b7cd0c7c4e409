"""Power budgets end to end (#30): the simulator's fleet (two nodes of four GPUs, every job training at
full load) publishes frames on a real nats-server and answers power commands through the agents' own
executor; a controller with a budget for ``rack=r1`` caps its GPUs through the real power actuator
(confirmed from telemetry), as one domain incident on the feed with the per-GPU limits as evidence, and
restores every limit, step by step, when the load drops or a demand-response shed ends. The shed and
the status go through the real ``healer power`` command."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

from healer import config, testing
from healer.actuators import base as actuators
from healer.actuators import kubernetes as kubernetes_actuator
from healer.actuators import power
from healer.agent import sim_fleet
from healer.bus import nats as natsbus
from healer.bus import subjects
from healer.controller.core import power_views, service
from healer.controller.power import power_budget
from healer.controller.remediation import policy
from healer.schemas import budgets, codec, incidents
from healer.sim import scenarios, simulation, workloads
from tests import conftest
from tests.controller.conftest import Harness, metric
from tests.fakes import fake_kube_api

RBAC = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "rbac.yaml"
STEP_S = 1.0
"""Simulated seconds per fleet tick (one every 0.2 s of the controller's clock)."""
GPUS = 8


def domain_events(harness: Harness) -> list[incidents.IncidentEvent]:
    return [e for e in harness.feed.events if e.data.rule_id == power_budget.RULE_ID]


def steady(sim: simulation.Simulation, kind: int) -> None:
    """Every node runs ``kind`` for good: no job ends, no checkpoint dip (the test drives the load)."""
    work = sim.fleet.work
    work.kind[:] = kind
    work.end_t[:] = np.inf
    work.ckpt_phase[:] = workloads.CHECKPOINT_LENGTH_S + 1.0


class Rig:
    def __init__(
        self, harness: Harness, sim: simulation.Simulation, fleet: sim_fleet.LiveFleet, full_w: float
    ) -> None:
        self.harness = harness
        self.sim = sim
        self.fleet = fleet
        self.full_w = full_w
        self.names = list(sim.fleet.node_names)
        self.ctl: service.Controller

    async def start(
        self,
        tmp_path: pathlib.Path,
        controller: dict[str, Any] | None = None,
        wrap: Callable[[actuators.Actuator], actuators.Actuator] = lambda a: a,
        scheduler: actuators.Actuator | None = None,
        labels: dict[str, dict[str, str]] | None = None,
        **budget: Any,
    ) -> service.Controller:
        """A controller with a budget for ``rack=r1`` (every node of the fleet, plus ``labels`` in the
        inventory file) and ``scheduler`` as its scheduler actuator (a recording one by default)."""
        inventory = tmp_path / "nodes.yaml"
        inventory.write_text(
            json.dumps({"nodes": {n: {"rack": "r1", **(labels or {}).get(n, {})} for n in self.names}})
        )
        s = self.harness.settings(
            admission="file", inventory_file=str(inventory),
            power_budgets=[{
                "key": "rack", "value": "r1", "hold_s": 1.0, "restore_after_s": 1.0,
                "restore_step_percent": 25.0, "hysteresis_percent": 5.0, **budget,
            }], **(controller or {}),
        )  # fmt: skip
        name = f"controller-power-{len(self.harness.controllers)}"
        bus = await natsbus.NatsBus.connect(self.harness.srv.url, name=name)
        self.ctl = await service.build(
            s, bus, scheduler=scheduler or testing.RecordingActuator(),
            power=lambda c: wrap(power.PowerActuator(bus, c, c.subjects, s.actuators)),
        )  # fmt: skip
        await self.ctl.start()
        self.harness.controllers.append((self.ctl, bus))
        return self.ctl

    async def until(self, done: Callable[[], bool], timeout: float = 60.0) -> None:
        """The fleet ticks (frames published, commands answered) until ``done``."""
        async with asyncio.timeout(timeout):
            while not done():
                await self.fleet.tick(STEP_S)
                await asyncio.sleep(0.2)

    def caps_done(self) -> bool:
        ev = domain_events(self.harness)
        acts = ev[-1].data.actions if ev else []
        return sum(a.kind == "power_limit" and a.status == "done" for a in acts) >= GPUS

    def resolved(self) -> bool:
        return any(e.change == "resolved" for e in domain_events(self.harness))

    def all_at_default(self) -> bool:
        return all(
            (pl := self.sim.fleet.power_limits(n, g)).current_w == pl.default_w
            for n in range(2)
            for g in range(4)
        )


@contextlib.asynccontextmanager
async def fleet_rig(harness: Harness, names: list[str] | None = None) -> AsyncIterator[Rig]:
    """Two simulated nodes of four GPUs (``names``, else the simulator's), training at full load."""
    sc = scenarios.Scenario.model_validate({"name": "power", "workload": {"training": 1.0}})
    sim = scenarios.build(
        sc, nodes=2, gpus=4, seed=5, start_ts=time.time(), run_id=scenarios.fresh_run_id(), names=names
    )  # fmt: skip
    steady(sim, workloads.TRAINING)
    for _ in range(20):  # utilisation settles at full load
        sim.step(STEP_S)
    fleet_bus = await natsbus.NatsBus.connect(harness.srv.url, name="fleet")
    fleet = sim_fleet.LiveFleet(sim, fleet_bus, subjects.Subjects())
    await fleet.start()
    try:
        yield Rig(harness, sim, fleet, float(sim.fleet.power.sum()))
    finally:
        await fleet.close()
        await fleet_bus.close()


@pytest.fixture
async def rig(harness: Harness) -> AsyncIterator[Rig]:
    async with fleet_rig(harness) as r:
        yield r


class InFlight:
    """The real power actuator, counting how many of its requests are in flight at once."""

    def __init__(self, inner: actuators.Actuator) -> None:
        self.inner = inner
        self.name = inner.name
        self.now = 0
        self.most = 0

    async def apply(self, request: actuators.ActionRequest) -> actuators.ActionOutcome:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            return await self.inner.apply(request)
        finally:
            self.now -= 1


async def test_a_steps_caps_go_out_together_and_count_once_per_node_in_the_rate_window(
    rig: Rig, tmp_path: pathlib.Path
) -> None:
    """A budget's step across a rack's GPUs runs at once, not one GPU's confirmation (its next frame)
    after another's, which made a 64-GPU step take a minute (#30); the fleet-wide rate window counts it
    once per node."""
    made: list[InFlight] = []

    def counting(inner: actuators.Actuator) -> actuators.Actuator:
        made.append(InFlight(inner))
        return made[-1]

    ctl = await rig.start(tmp_path, wrap=counting, contract_kw=round(0.8 * rig.full_w / 1000.0, 3))
    await rig.until(rig.caps_done)
    [actuator] = made
    assert actuator.most > 1, "the GPUs of a step were capped together"
    caps = sum(
        a.kind == "power_limit" and a.status == "done" for a in domain_events(rig.harness)[-1].data.actions
    )
    window = await ctl.state.get(f"{policy.RATE_PREFIX}power_limit")
    assert window is not None
    assert len(window.value["at"]) < caps, "the window counts nodes per step, not GPUs"
    assert len(window.value["at"]) % 2 == 0, "each step on the rack's two nodes: two entries"


def assert_one_restored_episode(rig: Rig) -> incidents.IncidentData:
    events = domain_events(rig.harness)
    assert [e.change for e in events].count(incidents.Change.OPENED) == 1, (
        "one domain incident for the episode"
    )
    assert all(e.data.incident_id == events[0].data.incident_id for e in events)
    final = events[-1].data
    assert final.state == "resolved"
    assert final.node == "rack.r1"
    assert final.schema_ == incidents.SCHEMA_V2
    assert final.domain is not None
    assert (final.domain.key, final.domain.value) == ("rack", "r1")
    names = rig.sim.fleet.node_names
    assert sorted(final.domain.members) == sorted(names)
    assert final.evidence["domain"] == "rack=r1"
    assert final.evidence["outcome"] == "restored"
    assert all(f"gpu.{n}.{g}" in final.evidence for n in names for g in range(4)), "per-GPU evidence"
    assert all(a.status == "done" for a in final.actions if a.kind == "power_limit")
    restores = [a for a in final.actions if a.kind == "restore_power_limit"]
    assert len(restores) == GPUS, "each GPU released once"
    assert all(a.status == "done" for a in restores)
    assert all(a.detail.startswith(tuple(names)) for a in final.actions), "each record names its GPU"
    assert rig.all_at_default(), "every GPU back at the limit it had"
    assert not [e for e in rig.harness.feed.events if e.data.rule_id != power_budget.RULE_ID], "nothing else"
    return final


async def test_a_rack_over_budget_is_capped_as_one_domain_incident_and_restored_when_load_drops(
    rig: Rig, tmp_path: pathlib.Path
) -> None:
    budget_kw = round(0.8 * rig.full_w / 1000.0, 3)
    ctl = await rig.start(tmp_path, {"energy_accounting": True}, contract_kw=budget_kw)
    names = rig.sim.fleet.node_names
    assert ctl.learning.failslow is not None
    await rig.until(lambda: ctl.ingest.energy is not None and bool(ctl.ingest.energy.last))
    index = ctl.learning.failslow.jobs
    await rig.until(lambda: index.job_of(names[0], 0) is not None)
    job_id = index.job_of(names[0], 0)  # the simulated node's own job, from its frames' GPU jobs
    assert job_id is not None
    assert {index.job_of(names[0], g) for g in range(GPUS // 2)} == {job_id}, "one job on the first node"
    assert index.job_of(names[1], 0) != job_id
    energy_from = float(rig.sim.fleet.energy.sum())  # the simulator's own counters: the truth
    await rig.until(rig.caps_done)
    await rig.until(lambda: "sm_clock_after_mhz" in domain_events(rig.harness)[-1].data.evidence)
    cost = domain_events(rig.harness)[-1].data.evidence
    assert float(cost["sm_clock_after_mhz"] or 0) < float(cost["sm_clock_before_mhz"] or 0), "clocks drop"
    assert float(cost["draw_after_w"] or 0) <= budget_kw * 1000 * 1.02
    capped_draw = []
    for _ in range(5):  # the capped rack, a few seconds on
        await rig.fleet.tick(STEP_S)
        await asyncio.sleep(0.2)
        capped_draw.append(float(rig.sim.fleet.power.sum()))
    assert ctl.power_budgets.views["rack=r1"].phase is power_budget.Phase.CAPPED
    stored = await ctl.state.get(power_views.kv_key(ctl.cs.power_budgets[0]))
    assert stored is not None
    assert len(stored.value["capped_w"]) == GPUS, "the state is in KV for a new leader"
    assert stored.value["sent_at"] is None, "the step's limits showed in the readings ..."
    assert 0 < stored.value["lag_s"] < 30, "... and how long that took is kept for the next hold"
    live = stored.value["live"]  # what the status page shows: the leader's view at its steps
    view = ctl.power_budgets.views["rack=r1"]
    assert live["phase"] == "capped"
    assert (live["gpus"], live["members"], live["capped_gpus"]) == (GPUS, 2, GPUS)
    assert live["budget_in_force_w"] == pytest.approx(budget_kw * 1000)
    assert live["draw_w"] == pytest.approx(view.draw_w, abs=0.02 * budget_kw * 1000)
    assert live["incident_id"] == domain_events(rig.harness)[-1].data.incident_id

    steady(rig.sim, workloads.IDLE)  # the jobs end: the rack has headroom
    await rig.until(rig.resolved, timeout=90)
    final = assert_one_restored_episode(rig)
    assert float(final.evidence["energy_kwh"] or 0) > 0, "the episode's energy on the feed"
    job_kwh = float(final.evidence[f"energy_kwh.{job_id}"] or 0)
    assert (
        0.3 * float(final.evidence["energy_kwh"] or 0)
        < job_kwh
        < 0.7 * float(final.evidence["energy_kwh"] or 0)
    )
    meter = ctl.ingest.energy
    assert meter is not None
    truth = float(rig.sim.fleet.energy.sum()) - energy_from
    last_w = float(rig.sim.fleet.energy.sum())  # the last frame ingested, and folded into the counters
    await conftest.until(lambda: abs(sum(meter.last.values()) - last_w) < 1.0 and not meter.by_domain)
    counted = metric(ctl.metrics, "energy_joules_total", domain="rack=r1")
    assert counted == pytest.approx(truth, rel=0.05), "the rack's energy, as the GPUs' counters say"
    job = metric(ctl.metrics, "job_energy_joules_total", job=job_id)
    assert 0.3 * counted < job < 0.7 * counted, "the job ran on one of the two nodes"
    assert max(capped_draw) <= budget_kw * 1000 * 1.02, (
        f"capped under the budget: {capped_draw} vs {budget_kw}"
    )
    stored = await ctl.state.get(power_views.kv_key(ctl.cs.power_budgets[0]))
    assert stored is not None
    assert stored.value["capped_w"] == {}


async def test_a_new_leader_carries_the_episode_on_from_kv_and_restores_what_the_old_one_capped(
    rig: Rig, tmp_path: pathlib.Path
) -> None:
    budget_kw = round(0.8 * rig.full_w / 1000.0, 3)
    first = await rig.start(tmp_path, contract_kw=budget_kw)
    await rig.until(lambda: first.leader)
    second = await rig.start(tmp_path, contract_kw=budget_kw)
    await rig.until(rig.caps_done)
    assert first.leader
    assert not second.leader
    assert second.power_budgets.states is None, "a standby keeps no state of its own"
    await rig.harness.crash(first)  # SIGKILL: no lease release, nothing saved on the way out

    steady(rig.sim, workloads.IDLE)  # load drops while the new leader takes over
    await rig.until(rig.resolved, timeout=90)
    assert second.leader
    final = assert_one_restored_episode(rig)  # the same incident, restored by the new leader
    assert final.evidence["cycles"] == 1, "one cap cycle: the new leader did not start another"
    assert second.lease.token is not None
    for n in range(2):  # the agents last obeyed the new leader's fencing token: it sent the restores
        assert rig.fleet.executor(n).fencing_token == second.lease.token


async def test_a_dry_run_plans_the_episode_once_and_touches_no_gpu(rig: Rig, tmp_path: pathlib.Path) -> None:
    ctl = await rig.start(tmp_path, {"mode": "dry-run"}, contract_kw=round(0.8 * rig.full_w / 1000.0, 3))

    def planned(kind: str) -> int:
        ev = domain_events(rig.harness)
        return sum(a.kind == kind and a.status == "planned" for a in (ev[-1].data.actions if ev else []))

    await rig.until(lambda: planned("power_limit") >= GPUS)
    for _ in range(15):  # several hold times at full load: the planned caps are taken as holding
        await rig.fleet.tick(STEP_S)
        await asyncio.sleep(0.2)
    assert planned("power_limit") == GPUS, "planned once, not again every hold time"
    assert rig.all_at_default(), "a dry run changes no GPU"
    assert ctl.power_budgets.views["rack=r1"].phase is power_budget.Phase.CAPPED

    steady(rig.sim, workloads.IDLE)
    await rig.until(rig.resolved, timeout=90)
    assert planned("restore_power_limit") == GPUS
    assert rig.all_at_default()
    [opened] = [e for e in domain_events(rig.harness) if e.change == "opened"]
    assert opened.data.mode == "dry-run"


async def healer(url: str, *args: str) -> tuple[int, str]:
    """The real ``healer`` command, as a person runs it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "healer", *args, "--nats", url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def while_ticking(rig: Rig, work: Any) -> Any:
    """Await ``work`` while the fleet keeps publishing (the controller keeps stepping meanwhile)."""
    task = asyncio.ensure_future(work)
    with contextlib.suppress(TimeoutError):
        await rig.until(task.done, timeout=30)
    return await task


async def test_a_demand_response_shed_caps_the_rack_then_restores_it_when_it_ends(
    rig: Rig, tmp_path: pathlib.Path
) -> None:
    ctl = await rig.start(tmp_path, contract_kw=round(1.3 * rig.full_w / 1000.0, 3))  # well under budget
    url = rig.harness.srv.url
    await rig.until(lambda: ctl.leader and "rack=r1" in ctl.power_budgets.views)
    rc, out = await while_ticking(rig, healer(url, "power", "status", "--json"))
    assert rc == 0, out
    [before] = json.loads(out)["budgets"]
    assert before["phase"] == "under"
    assert before["gpus"] == GPUS
    assert before["draw_w"] == pytest.approx(rig.full_w, rel=0.1)

    shed_kw = round(0.75 * rig.full_w / 1000.0, 3)
    shed = ("power", "shed", "--domain", "rack=r1")
    rc, out = await while_ticking(rig, healer(url, *shed, "--to", str(shed_kw), "--for", "30m"))
    assert rc == 0, out
    assert "holding" in out
    await rig.until(rig.caps_done)
    capped = float(rig.sim.fleet.power.sum())
    assert capped <= shed_kw * 1000 * 1.02, "held under the shed"
    rc, out = await while_ticking(rig, healer(url, "power", "status"))
    assert rc == 0, out
    assert "rack=r1  capped" in out
    assert "shed to" in out
    stored = await ctl.state.get(power_views.kv_key(ctl.cs.power_budgets[0]))
    assert stored is not None
    assert stored.value["shed_to_w"] == pytest.approx(shed_kw * 1000), "the shed is in KV for a new leader"
    assert not rig.resolved()

    rc, out = await while_ticking(rig, healer(url, *shed, "--cancel"))  # the utility's event is over
    assert rc == 0, out
    await rig.until(rig.resolved, timeout=90)  # at full load, restored under the rack's own budget
    final = assert_one_restored_episode(rig)
    assert final.evidence["shed_to_w"] is None

    rc, out = await while_ticking(rig, healer(url, "power", "shed", "--domain", "rack=r9", "--to", "1"))
    assert rc == 1, "a domain without a budget is refused"
    assert "no power budget for 'rack=r9'" in out
    rc, out = await while_ticking(rig, healer(url, *shed, "--to", "100000", "--for", "1m"))
    assert rc == 0, out
    assert "its own budget" in out, "a shed above the budget says it changes nothing"
    bad = await rig.harness.bus.request(
        ctl.subjects.power_shed, b'{"schema": "healer.power_shed.v1"}', timeout=5
    )
    result = codec.decode_shed_result(bad.data)
    assert not result.ok, "a request that does not decode is answered, not dropped"
    assert isinstance(result, budgets.ShedResult)


PRIORITY_SETTLE_S = 20.0
"""Simulated seconds of training after which every GPU draws what it would at full load (the rig's
training ramp takes about 12)."""


async def a_priority_episode(
    rig: Rig,
    tmp_path: pathlib.Path,
    scheduler: actuators.Actuator,
    ranks: dict[str, Any],
    low: str,
) -> tuple[service.Controller, incidents.IncidentData]:
    """``policy: priority`` with ranks from the jobs (``controller.power_priority``): the rack idles
    while the controller lists ``scheduler``'s jobs, then both nodes train and take it over a budget
    (85 % of full load) that capping one node alone can meet. Node ``low`` carries the node label
    ``priority: high`` (ranked 5 by the budget), which its job's rank must override. Returns the
    controller and the domain incident once the rack has trained at full load for
    ``PRIORITY_SETTLE_S`` and its caps are done and hold it under its budget. The simulator's frames
    carry job ids of their own, which the scheduler does not list: the scheduler's placement ranks."""
    steady(rig.sim, workloads.IDLE)
    ctl = await rig.start(
        tmp_path, {"power_priority": ranks, "jobs_refresh_s": 0.2}, scheduler=scheduler,
        labels={low: {"priority": "high"}}, contract_kw=round(0.85 * rig.full_w / 1000.0, 3),
        policy="priority", priorities={"high": 5},
    )  # fmt: skip
    assert ctl.learning.failslow is not None
    index = ctl.learning.failslow.jobs
    await rig.until(lambda: all(index.info_at(n, g) is not None for n in rig.names for g in range(4)))
    steady(rig.sim, workloads.TRAINING)
    trained_from = rig.sim.fleet.t

    def settled() -> bool:
        events = domain_events(rig.harness)
        view = ctl.power_budgets.views.get("rack=r1")
        return (
            rig.sim.fleet.t - trained_from >= PRIORITY_SETTLE_S
            and bool(events)
            and all(a.status is not None for a in events[-1].data.actions)
            and not ctl.power_budgets.pending(ctl.power_budgets.incident(ctl.cs.power_budgets[0]))
            and view is not None
            and view.draw_w <= view.budget_w
        )

    await rig.until(settled, timeout=90)
    return ctl, domain_events(rig.harness)[-1].data


def assert_only_the_low_job_capped(rig: Rig, data: incidents.IncidentData, low: str, rank: str) -> None:
    high = next(n for n in rig.names if n != low)
    caps = [a for a in data.actions if a.kind == "power_limit"]
    assert caps, "the rack was capped"
    assert all(a.detail.startswith(f"{low} gpu ") for a in caps), "only the low-priority job's GPUs capped"
    assert all(a.status == "done" for a in caps)
    assert {k for k in data.evidence if k.startswith("gpu.")} == {f"gpu.{low}.{g}" for g in range(4)}
    assert {data.evidence.get(f"rank.{low}.{g}") for g in range(4)} == {rank}, "each cap says why"
    assert not [k for k in data.evidence if k.startswith(f"rank.{high}.")]
    n_low, n_high = rig.names.index(low), rig.names.index(high)
    for g in range(4):
        held = rig.sim.fleet.power_limits(n_low, g)
        assert held.min_w <= held.current_w < held.default_w, "capped, never below the minimum limit"
        kept = rig.sim.fleet.power_limits(n_high, g)
        assert kept.current_w == kept.default_w, "the high-priority job keeps its limits"


async def test_priority_ranks_gpus_by_their_pods_priority_class_on_kubernetes(
    harness: Harness, tmp_path: pathlib.Path
) -> None:
    """#30's "Kubernetes priority class": the pods holding each node's GPUs, listed through the real
    ``kubernetes`` client from the fake API server; the node whose pod runs in class ``batch-low`` is
    capped, the one in ``training-high`` is not, whatever the nodes' own labels say."""
    api = fake_kube_api.FakeKubeAPI(rbac_rules=fake_kube_api.cluster_role_rules(RBAC.read_text()))
    api.start()
    kubeconfig = tmp_path / "kubeconfig"
    api.write_kubeconfig(str(kubeconfig))
    names = ["node-a", "node-b"]
    for n in names:
        api.add_node(n)
    api.add_pod(
        "ml", "llm-0", "node-a", gpus=4, labels={"job-name": "llm"}, priority_class=("training-high", 1000)
    )
    api.add_pod(
        "ml", "sweep-0", "node-b", gpus=4, labels={"job-name": "sweep"}, priority_class=("batch-low", 10)
    )
    api.add_pod("web", "nginx", "node-a", priority_class=("batch-low", 10))  # no GPUs: no job of a GPU
    kube = kubernetes_actuator.KubernetesActuator(config.ActuatorSettings(kube_config=str(kubeconfig)))
    try:
        async with fleet_rig(harness, names) as rig:
            ranks = {"priority_class": {"training-high": 2, "batch-low": 1}}
            _, data = await a_priority_episode(rig, tmp_path, kube, ranks, low="node-b")
            assert_only_the_low_job_capped(rig, data, "node-b", "1 (job ml/sweep: priority class batch-low)")
    finally:
        kube.close()
        api.stop()
    assert ("list", "pods") in api.calls(), "the pods came from the API server"
