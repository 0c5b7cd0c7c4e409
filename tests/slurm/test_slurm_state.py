"""Node state read by a narrow ``sinfo`` (#43) against the real Slurm: the same state, flags and reason as
``sinfo --json`` gives, for concurrent reads one ``sinfo`` listing only the nodes asked about, and the
JSON read when a node is missing from it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from healer.actuators import base, slurm, slurm_state
from tests.slurm.cluster import SlurmCluster
from tests.slurm.test_slurm_actuator import actuator, cluster  # noqa: F401

pytestmark = pytest.mark.slurm


def counting(actuator: slurm.SlurmActuator) -> list[list[str]]:  # noqa: F811
    calls: list[list[str]] = []
    run = actuator._run_argv

    async def counted(argv: Sequence[str], stdin: str | None = None) -> slurm.Result:
        calls.append(list(argv))
        return await run(argv, stdin)

    actuator._run_argv = counted  # type: ignore[method-assign]
    actuator.batch._cmd = counted
    return calls


async def test_the_narrow_read_says_what_the_json_says(
    cluster: SlurmCluster,  # noqa: F811
    actuator: slurm.SlurmActuator,  # noqa: F811
) -> None:
    cluster.run("scontrol", "update", "NodeName=gpu02", "State=DRAIN", 'Reason=healer: inc-9 x|y "q" z')
    cluster.run("scontrol", "update", "NodeName=gpu03", "State=DRAIN", "Reason=maintenance by ops")
    cluster.run("scontrol", "reboot", "ASAP", "nextstate=DOWN", "reason=healer: inc-8 reboot", "gpu04")
    try:
        calls = counting(actuator)
        states = await asyncio.gather(*(actuator.node_state(n) for n in cluster.nodes))
        assert [c[1:] for c in calls] == [
            ["-a", "-h", "-N", "-n", ",".join(cluster.nodes), "-O", slurm_state.FORMAT]
        ], "one narrow sinfo for the concurrent reads, of their nodes only"
        document = await actuator._json("sinfo", "--json")
        by_json = {e["name"]: slurm_state.NodeState.of(e) for e in document["nodes"]}
        assert states == [by_json[n] for n in cluster.nodes]
        gpu02, gpu03, gpu04 = states[1:]
        assert gpu02 is not None
        assert gpu02.drained
        assert gpu02.incident == "inc-9"
        assert gpu02.reason == 'healer: inc-9 x|y "q" z', "a | in a reason is kept"
        assert gpu03 is not None
        assert gpu03.drained
        assert not gpu03.healer_owned
        assert gpu04 is not None
        pending = {"DRAIN", "REBOOT_REQUESTED"} <= set(gpu04.flags)
        assert pending or gpu04.down, gpu04  # a reboot that already completed comes back down
    finally:
        cluster.run("scontrol", "update", "NodeName=gpu04", "State=RESUME", check=False)


async def test_a_node_slurm_does_not_list_is_looked_up_in_the_json(
    cluster: SlurmCluster,  # noqa: F811
    actuator: slurm.SlurmActuator,  # noqa: F811
) -> None:
    calls = counting(actuator)
    states = await asyncio.gather(actuator.node_state("gpu01"), actuator.node_state("gpu99"))
    assert states[0] is not None
    assert states[0].state == "idle"
    assert states[1] is None, "Slurm knows no gpu99"
    assert [c[1] for c in calls] == ["-a", "--json"], "the narrow read, then the JSON for the missing one"
    outcome = await actuator.apply(base.ActionRequest(incident_id="inc-1", kind="uncordon", node="gpu99"))
    assert outcome.status == "failed-permanent"
    assert "does not know" in outcome.detail
