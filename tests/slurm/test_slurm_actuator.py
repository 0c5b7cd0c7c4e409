"""The Slurm actuator against a real slurmctld with four slurmd (see start.sh)."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator

import pytest

from healer import config
from healer.actuators import base, slurm
from healer.controller.inventory import jobs
from tests.slurm.cluster import SlurmCluster

pytestmark = pytest.mark.slurm


def wait_for(what: str, check: object, timeout_s: float = 20.0) -> None:
    """Poll ``check()`` until it is true; fail naming ``what`` when it never is."""
    assert callable(check)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def node_line(cluster: SlurmCluster, node: str) -> tuple[str, str]:
    """(state, reason). A trailing ``*`` (slurmd slow to answer a ping on a loaded test machine) is
    dropped: the tests are about the drain state and reason, not about ping latency."""
    # one line per partition the node is in (gpu01-02 are in two): the same state and reason on each
    out = (cluster.run("sinfo", "-N", "-h", "-n", node, "-o", "%T|%E").stdout.strip().splitlines() or [""])[0]
    state, _, reason = out.partition("|")
    return state.rstrip("*"), reason


def job_state(cluster: SlurmCluster, job_id: str) -> tuple[str, str]:
    out = cluster.run("squeue", "-h", "-j", job_id, "-o", "%T|%N", check=False).stdout.strip()
    state, _, node = out.partition("|")
    return state, node


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The shared cluster, with no jobs and every node idle before and after the test."""

    def reset() -> None:
        slurm_cluster.run("scancel", "--user=root", check=False)
        wait_for("no jobs", lambda: not slurm_cluster.run("squeue", "-h").stdout.strip())
        for node in slurm_cluster.nodes:
            slurm_cluster.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
        wait_for(
            "idle nodes",
            lambda: all(node_line(slurm_cluster, n)[0].rstrip("*") == "idle" for n in slurm_cluster.nodes),
        )

    reset()
    yield slurm_cluster
    reset()


@pytest.fixture
def actuator(cluster: SlurmCluster) -> slurm.SlurmActuator:
    settings = config.ActuatorSettings(
        slurm_conf=str(cluster.conf), retry_attempts=2, retry_initial_delay_s=0.01, call_timeout_s=20
    )
    return slurm.SlurmActuator(settings)


def request(kind: base.RequestKind, node: str, **kw: object) -> base.ActionRequest:
    return base.ActionRequest.model_validate(
        {"incident_id": "inc-42", "kind": kind, "node": node, "summary": "xid 79 on gpu 3", **kw}
    )


def submit(cluster: SlurmCluster, *extra: str) -> str:
    out = cluster.run("sbatch", "--parsable", "-o", "/dev/null", *extra, "--wrap", "sleep 600").stdout
    job_id = out.strip().split(";")[0]
    wait_for(f"job {job_id} running", lambda: job_state(cluster, job_id)[0] == "RUNNING")
    return job_id


async def test_cordon_drains_with_a_healer_reason(
    cluster: SlurmCluster, actuator: slurm.SlurmActuator
) -> None:
    outcome = await actuator.apply(request("cordon", "gpu01"))
    assert outcome.status == "done", outcome
    state, reason = node_line(cluster, "gpu01")
    assert state in ("drained", "draining")
    assert reason == "healer: inc-42 xid 79 on gpu 3"
    again = await actuator.apply(request("cordon", "gpu01"))
    assert again.status == "already-done"


async def test_uncordon_resumes_only_healers_own_drain(
    cluster: SlurmCluster, actuator: slurm.SlurmActuator
) -> None:
    await actuator.apply(request("cordon", "gpu02"))
    other = await actuator.apply(request("uncordon", "gpu02", incident_id="inc-other"))
    assert other.status == "refused"
    assert node_line(cluster, "gpu02")[0] == "drained"
    outcome = await actuator.apply(request("uncordon", "gpu02"))
    assert outcome.status == "done", outcome
    assert node_line(cluster, "gpu02")[0].rstrip("*") == "idle"
    assert (await actuator.apply(request("uncordon", "gpu02"))).status == "already-done"


async def test_an_operators_drain_is_never_lifted_nor_relabelled(
    cluster: SlurmCluster, actuator: slurm.SlurmActuator
) -> None:
    cluster.run("scontrol", "update", "NodeName=gpu03", "State=DRAIN", "Reason=disk swap, ask bob")
    cordon = await actuator.apply(request("cordon", "gpu03"))
    uncordon = await actuator.apply(request("uncordon", "gpu03", params={"any_incident": True}))
    assert cordon.status == "already-done"
    assert uncordon.status == "refused"
    assert "operator" in uncordon.detail
    assert node_line(cluster, "gpu03") == ("drained", "disk swap, ask bob")


async def test_migrate_requeues_a_running_job_off_the_drained_node(
    cluster: SlurmCluster, actuator: slurm.SlurmActuator
) -> None:
    job_id = submit(cluster, "--requeue")
    node = job_state(cluster, job_id)[1]
    outcome = await actuator.apply(request("migrate", node))
    assert outcome.status == "done", outcome
    assert outcome.items == [base.ItemResult(item=f"job {job_id}", status="done", detail="requeued")]
    assert node_line(cluster, node)[0] in ("drained", "draining")
    wait_for(
        "job pending again or running elsewhere",
        lambda: (
            job_state(cluster, job_id)[0] == "PENDING"
            or (job_state(cluster, job_id)[0] == "RUNNING" and job_state(cluster, job_id)[1] != node)
        ),
    )


async def test_migrate_reports_a_job_that_cannot_be_requeued(
    cluster: SlurmCluster, actuator: slurm.SlurmActuator
) -> None:
    job_id = submit(cluster, "--no-requeue")
    node = job_state(cluster, job_id)[1]
    planned = await actuator.apply(request("migrate", node, dry_run=True))
    assert [i.detail for i in planned.items] == [
        "cannot be requeued: submitted with --no-requeue, or the cluster has JobRequeue=0"
    ]
    outcome = await actuator.apply(request("migrate", node))
    assert outcome.status == "failed-permanent"
    [item] = outcome.items
    assert item.item == f"job {job_id}"
    assert item.status == "failed-permanent"
    assert item.detail == (
        f"Requested operation is presently disabled for job {job_id} "
        "(submitted with --no-requeue, or the cluster has JobRequeue=0)"
    )
    assert job_state(cluster, job_id) == ("RUNNING", node)
    assert node_line(cluster, node)[0] in ("drained", "draining")


async def test_dry_run_reads_but_changes_nothing(
    cluster: SlurmCluster, actuator: slurm.SlurmActuator
) -> None:
    job_id = submit(cluster, "--requeue")
    node = job_state(cluster, job_id)[1]
    outcome = await actuator.apply(request("migrate", node, dry_run=True))
    assert outcome.status == "planned"
    assert outcome.dry_run
    assert [p.split(" ", 1)[1] for p in outcome.plan] == [
        f"update NodeName={node} State=DRAIN 'Reason=healer: inc-42 xid 79 on gpu 3'",
        f"requeue {job_id}",
        f"update JobId={job_id} StartTime=now",
    ]
    assert outcome.items == [base.ItemResult(item=f"job {job_id}", status="planned", detail="would requeue")]
    assert node_line(cluster, node)[0] in ("allocated", "mixed")
    assert job_state(cluster, job_id) == ("RUNNING", node)


async def test_an_unknown_node_is_a_permanent_failure_with_slurms_text(actuator: slurm.SlurmActuator) -> None:
    outcome = await actuator.apply(request("cordon", "gpu99"))
    assert outcome.status == "failed-permanent"
    assert outcome.detail == "slurm_update error: Invalid node name specified"


async def test_an_invalid_job_id_is_a_permanent_failure_with_slurms_text(
    actuator: slurm.SlurmActuator,
) -> None:
    item = await actuator.requeue("999999")
    assert item.status == "failed-permanent"
    assert item.detail == "Invalid job id specified for job 999999"


async def test_migrate_signals_jobs_to_checkpoint_before_requeueing(
    cluster: SlurmCluster, tmp_path: pathlib.Path
) -> None:
    marker = tmp_path / "checkpointed"
    script = f"trap 'echo ckpt > {marker}' USR1; while true; do sleep 0.2; done"
    out = cluster.run("sbatch", "--parsable", "--requeue", "-o", "/dev/null", "--wrap", script).stdout
    job_id = out.strip().split(";")[0]
    wait_for(f"job {job_id} running", lambda: job_state(cluster, job_id)[0] == "RUNNING")
    node = job_state(cluster, job_id)[1]
    graces: list[float] = []

    async def grace(seconds: float) -> None:
        """Stands in for the grace period: over as soon as the job has checkpointed."""
        graces.append(seconds)
        wait_for("the job's checkpoint", marker.exists)

    settings = config.ActuatorSettings(
        slurm_conf=str(cluster.conf), slurm_checkpoint_signal="USR1", slurm_checkpoint_grace_s=30
    )
    outcome = await slurm.SlurmActuator(settings, sleep=grace).apply(request("migrate", node))
    assert outcome.status == "done", outcome
    assert graces[0] == 30
    assert marker.read_text() == "ckpt\n"
    assert any(f"--signal=USR1 --full {job_id}" in step for step in outcome.plan)
    assert outcome.items == [base.ItemResult(item=f"job {job_id}", status="done", detail="requeued")]


async def test_a_reason_with_shell_and_scontrol_syntax_arrives_verbatim(
    cluster: SlurmCluster, actuator: slurm.SlurmActuator
) -> None:
    summary = "temp_c >= 90 \"hot\" $(reboot); State=RESUME 'x'"
    outcome = await actuator.apply(request("cordon", "gpu04", summary=summary))
    assert outcome.status == "done", outcome
    assert node_line(cluster, "gpu04") == ("drained", f"healer: inc-42 {summary}")


async def test_node_labels_are_partitions_and_active_features(actuator: slurm.SlurmActuator) -> None:
    """start.sh gives every node features h100,nvlink (and a rack and a PDU, #27); gpu01-02 are also in
    partition train."""
    labels = await actuator.node_labels(["gpu01", "gpu03", "not-a-node"])
    assert set(labels) == {"gpu01", "gpu03"}
    assert set(labels["gpu01"]["partition"].split(",")) == {"gpu", "train"}
    assert labels["gpu03"]["partition"] == "gpu"
    assert labels["gpu01"]["features"] == "h100,nvlink,rack=r01,pdu_p1"
    assert labels["gpu03"]["features"] == "h100,nvlink,rack=r02,pdu_p1"


async def test_squeue_places_a_two_node_job_on_both_its_nodes(
    cluster: SlurmCluster, actuator: slurm.SlurmActuator
) -> None:
    job_id = submit(cluster, "-N", "2")
    placements = jobs.placements_from_squeue(await actuator.jobs())
    nodes = sorted(p.node for p in placements if p.job == job_id)
    assert len(nodes) == 2
    assert set(nodes) <= set(cluster.nodes)
    index = jobs.JobIndex()
    index.set_scheduled("slurm", placements)
    assert {index.job_of(n, 0) for n in nodes} == {job_id}


async def test_a_stragglers_drain_lets_the_running_job_finish_on_the_node(
    cluster: SlurmCluster, actuator: slurm.SlurmActuator
) -> None:
    job_id = submit(cluster)
    node = job_state(cluster, job_id)[1]
    outcome = await actuator.apply(request("cordon", node, summary="gpu-straggler on GPU 5"))
    assert outcome.status == "done", outcome
    assert node_line(cluster, node)[0] == "draining"  # no new job lands; the running one goes on
    assert job_state(cluster, job_id) == ("RUNNING", node)
