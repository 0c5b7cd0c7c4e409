"""Node reboot through Slurm, end to end on the real one-host Slurm, where a reboot completes for real
(RebootProgram=reboot.sh restarts the node's slurmd with -b): drain, ``scontrol reboot ASAP
nextstate=DOWN``, the node's job requeued, the reboot issued and completed, the node back DOWN with
healer's reason for validation, then resumed (return to service)."""

from __future__ import annotations

import asyncio

import pytest

from healer.actuators import base, slurm
from tests.slurm.cluster import SlurmCluster
from tests.slurm.test_slurm_actuator import actuator, cluster, job_state, node_line, request, submit, wait_for

pytestmark = pytest.mark.slurm
__all__ = ["actuator", "cluster"]  # fixtures


async def _wait_phase(act: slurm.SlurmActuator, node: str, phase: base.RebootPhase) -> base.RebootStatus:
    status = await act.reboot_status(node)
    for _ in range(600):  # up to ~60 s: ResumeTimeout
        if status.phase is phase:
            return status
        await asyncio.sleep(0.1)
        status = await act.reboot_status(node)
    pytest.fail(f"{node} never reached reboot phase {phase}; last {status}")


async def test_a_reboot_waits_for_the_job_completes_and_the_node_returns_after_validation(
    cluster: SlurmCluster, actuator: slurm.SlurmActuator
) -> None:
    job = submit(cluster, "-w", "gpu04")
    boots_before = cluster.state_dir.joinpath("log", "reboots.log")
    before = boots_before.read_text().count("gpu04") if boots_before.exists() else 0
    boot_time_before = (await actuator.reboot_status("gpu04")).boot_time
    assert (await actuator.apply(request("cordon", "gpu04"))).status == "done"

    out = await actuator.apply(request("reboot_node", "gpu04"))
    assert out.status == "done", out.detail
    assert out.plan[0].endswith(
        "scontrol reboot ASAP nextstate=DOWN 'reason=healer: inc-42 xid 79 on gpu 3' gpu04"
    )
    status = await actuator.reboot_status("gpu04")
    assert status.phase is base.RebootPhase.REQUESTED  # the job still runs: ASAP waits for it
    again = await actuator.apply(request("reboot_node", "gpu04"))
    assert again.status == "already-done"

    moved = await actuator.apply(request("migrate", "gpu04"))
    assert moved.status == "done", moved.detail
    done = await _wait_phase(actuator, "gpu04", base.RebootPhase.COMPLETE)
    assert done.reason == "healer: inc-42 xid 79 on gpu 3 : reboot issued : reboot complete"
    assert done.boot_time != boot_time_before
    assert boots_before.read_text().count("gpu04") == before + 1
    assert node_line(cluster, "gpu04")[0] == "down"  # nothing runs on it before validation
    assert job_state(cluster, job)[1] != "gpu04"

    back = await actuator.apply(request("uncordon", "gpu04"))  # return to service, after validation
    assert back.status == "done", back.detail
    wait_for("gpu04 idle", lambda: node_line(cluster, "gpu04")[0] in ("idle", "mixed", "allocated"))
    assert (await actuator.reboot_status("gpu04")).phase is base.RebootPhase.NONE


async def test_another_incident_cannot_return_a_rebooted_node(
    cluster: SlurmCluster, actuator: slurm.SlurmActuator
) -> None:
    assert (await actuator.apply(request("reboot_node", "gpu03"))).status == "done"
    await _wait_phase(actuator, "gpu03", base.RebootPhase.COMPLETE)
    other = await actuator.apply(request("uncordon", "gpu03", incident_id="inc-other"))
    assert other.status == "refused"
    assert node_line(cluster, "gpu03")[0] == "down"


async def test_an_operators_drained_node_is_never_rebooted(
    cluster: SlurmCluster, actuator: slurm.SlurmActuator
) -> None:
    cluster.run("scontrol", "update", "NodeName=gpu02", "State=DRAIN", "Reason=ops: cabling")
    out = await actuator.apply(request("reboot_node", "gpu02"))
    assert out.status == "refused"
    assert "drained by an operator" in out.detail
    assert (await actuator.reboot_status("gpu02")).phase is base.RebootPhase.NONE


async def test_dry_run_plans_the_reboot_and_changes_nothing(
    cluster: SlurmCluster, actuator: slurm.SlurmActuator
) -> None:
    out = await actuator.apply(request("reboot_node", "gpu01", dry_run=True))
    assert out.status == "planned"
    assert "nextstate=DOWN" in out.plan[0]
    assert node_line(cluster, "gpu01") == ("idle", "none")
