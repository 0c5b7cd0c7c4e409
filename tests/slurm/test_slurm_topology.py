"""Failure domains on the real one-host Slurm (#27): slurmctld reads the cluster's ``topology.conf``
(topology/tree) and prints it back through ``scontrol show topology``, which healer parses to the same
switch tree; then a leaf-switch loss over its three nodes (real agents reading recorded sysfs trees
with the InfiniBand link down) is one shared-cause incident, the nodes are drained for real, and the
fabric ladder's reboots are held: no node reboots."""

from __future__ import annotations

import asyncio
import json
import pathlib
from collections.abc import AsyncIterator

import pytest
import yaml

from healer import config, testing
from healer.actuators import slurm
from healer.agent import daemon
from healer.bus import embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.cli import main as cli_main
from healer.controller.core import service
from healer.controller.incidents import shared_cause
from healer.controller.inventory import topology
from healer.sim import node_source
from healer.telemetry import rdma
from tests.slurm.cluster import SlurmCluster
from tests.slurm.test_end_to_end import eventually
from tests.slurm.test_slurm_actuator import cluster, node_line  # noqa: F401

pytestmark = pytest.mark.slurm

REPO = pathlib.Path(__file__).resolve().parents[2]
SYSFS = REPO / "tests" / "fixtures" / "sysfs"


def rules() -> str:
    """rules/fabric.yaml's rdma-port-down with its holds shortened, and a reboot ladder behind it."""
    doc = yaml.safe_load((REPO / "rules" / "fabric.yaml").read_text())
    (rule,) = [r for r in doc["rules"] if r["id"] == "rdma-port-down"]
    rule["for"], rule["resolve"] = "0s", {"for": "1h"}
    ladder = {
        "id": "reboot", "rules": ["rdma-port-down"], "steps": ["reboot_node"], "soak": "0s",
        "dcgm_level": 0, "repeat_limit": {"count": 3, "within": "30d"},
    }  # fmt: skip
    return yaml.safe_dump({"rules": [rule], "ladders": [ladder]})


def test_slurm_prints_back_the_switch_tree_healer_reads(cluster: SlurmCluster) -> None:  # noqa: F811
    shown = cluster.run("scontrol", "show", "topology").stdout
    from_slurm = topology.parse_topology_conf(shown, "scontrol show topology")
    from_file = topology.read_topology_file(str(cluster.conf.parent / "topology.conf"))
    assert from_slurm.problems == []
    assert from_file.problems == []
    assert from_slurm.domains == from_file.domains
    assert from_file.domains["gpu02"] == {"switch": "leaf-01", "switch_l2": "spine-1"}
    assert from_file.domains["gpu04"]["switch"] == "leaf-02"


def test_fleet_show_on_slurm_prints_node_features_and_the_switch_tree_as_one_topology(
    cluster: SlurmCluster,  # noqa: F811
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Item 1 of #27 on the real scheduler: ``sinfo --json`` admits the nodes and gives their features
    (``rack=r01`` as key=value, ``pdu_p1`` through ``domain_features``), ``topology.conf`` their switches,
    and ``healer fleet show`` prints the one topology the controller's ``Admission`` builds from both."""
    settings = tmp_path / "healer.yaml"
    settings.write_text(
        yaml.safe_dump(
            {
                "controller": {
                    "admission": "scheduler", "actuator": "slurm", "domain_features": {"pdu": "pdu_"},
                    "topology_file": str(cluster.conf.parent / "topology.conf"),
                },
                "actuators": {"slurm_conf": str(cluster.conf)},
            }
        )
    )  # fmt: skip
    assert cli_main(["fleet", "show", "--config", str(settings), *cluster.nodes, "not-in-slurm"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["nodes"] == 4, "the nodes sinfo lists, not the name it does not"
    assert doc["domains"]["rack"] == {"r01": ["gpu01", "gpu02"], "r02": ["gpu03", "gpu04"]}
    assert doc["domains"]["pdu"] == {"p1": ["gpu01", "gpu02", "gpu03", "gpu04"]}
    assert doc["domains"]["switch"] == {"leaf-01": ["gpu01", "gpu02", "gpu03"], "leaf-02": ["gpu04"]}
    assert cli_main(["fleet", "show", "--config", str(settings), "--by", "rack", "gpu03"]) == 0
    assert json.loads(capsys.readouterr().out) == {"key": "rack", "domains": {"r02": ["gpu03"]}}


@pytest.fixture
async def controller(
    cluster: SlurmCluster,  # noqa: F811
    nats_server: embedded.EmbeddedServer,
    tmp_path: pathlib.Path,
) -> AsyncIterator[service.Controller]:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "rules.yaml").write_text(rules())
    settings = config.Settings(
        nats=config.NatsSettings(url=nats_server.url),
        controller=config.ControllerSettings(
            rules_dir=str(tmp_path / "rules"), mode="enforce", tick_s=0.2, uncordon_hold_s=0,
            admission="scheduler", admission_refresh_s=0.2, breaker_max_percent=100,
            topology_file=str(cluster.conf.parent / "topology.conf"), shared_cause_min_nodes=3,
        ),
        actuators=config.ActuatorSettings(
            slurm_conf=str(cluster.conf), call_timeout_s=20, slurm_requeue_settle_s=1
        ),
    )  # fmt: skip
    bus = await natsbus.NatsBus.connect(nats_server.url, name="topology")
    await provision.ensure(bus, subjects.Subjects(), settings.nats)
    gpu = testing.RecordingGpuActuator()
    ctl = await service.build(settings, bus, scheduler=slurm.SlurmActuator(settings.actuators), gpu=gpu)
    await ctl.start()
    try:
        yield ctl
    finally:
        await ctl.stop()
        await bus.close()


async def test_a_leaf_switch_loss_on_slurm_is_one_domain_incident_and_no_reboots(
    cluster: SlurmCluster,  # noqa: F811
    controller: service.Controller,
    nats_server: embedded.EmbeddedServer,
    tmp_path: pathlib.Path,
) -> None:
    ctl = controller
    reboots = cluster.state_dir / "log" / "reboots.log"
    before = reboots.read_text() if reboots.exists() else ""
    healthy = (SYSFS / "cx7-ib-healthy.txt").read_text()
    roots = {n: rdma.write_tree(healthy, tmp_path / n / "sys") for n in cluster.nodes}
    stop = asyncio.Event()
    buses, tasks = [], []
    for node in cluster.nodes:
        bus = await natsbus.NatsBus.connect(nats_server.url, name=f"agent-{node}")
        agent = daemon.Agent(
            node=node, source=node_source.SimSource(node, gpus=2), bus=bus,
            state_dir=tmp_path / node / "agent", interval_s=0.2, ports=rdma.PortReader(roots[node]),
        )  # fmt: skip
        buses.append(bus)
        tasks.append(asyncio.create_task(agent.run(stop)))
    try:
        await eventually("every node admitted by sinfo", lambda: ctl.admission.admitted == set(cluster.nodes))
        assert ctl.admission.topology().of("gpu01")["switch"] == "leaf-01"
        assert ctl.admission.topology().of("gpu01")["rack"] == "r01", "a feature rack=r01 is a domain"
        down = (SYSFS / "cx7-ib-link-down.txt").read_text()
        for node in ("gpu01", "gpu02", "gpu03"):  # leaf-01 lost: every node under it loses its link
            rdma.write_tree(down, roots[node])
        await eventually(
            "one shared-cause incident for leaf-01",
            lambda: any(i.rule_id == shared_cause.RULE_ID for i in ctl.book.open.values()),
        )
        await eventually(
            "the three nodes drained by healer",
            lambda: all(
                node_line(cluster, n)[1].startswith("healer: inc-") for n in ("gpu01", "gpu02", "gpu03")
            ),
            60,
        )
        members = [i for i in ctl.book.open.values() if i.node in ("gpu01", "gpu02", "gpu03")]
        await eventually(
            "each member's reboot held by the domain incident",
            lambda: all(
                any(a.kind == "reboot_node" and "held by shared-cause" in a.detail for a in i.actions)
                for i in members
            ),
            60,
        )
        domains = [i for i in ctl.book.open.values() if i.rule_id == shared_cause.RULE_ID]
        assert len(domains) == 1
        assert domains[0].node == "switch.leaf-01"
        assert shared_cause.members_of(domains[0]) == ["gpu01", "gpu02", "gpu03"]
        assert node_line(cluster, "gpu04")[1] in ("", "none"), "the other leaf's node untouched"
        assert (reboots.read_text() if reboots.exists() else "") == before, "no node rebooted"
        assert not any(a.kind == "reboot_node" and a.status is not None for i in members for a in i.actions)
    finally:
        stop.set()
        await asyncio.gather(*(asyncio.wait_for(t, 10) for t in tasks))
        for bus in buses:
            await bus.close()
