"""Power budgets' priority policy on the real one-host Slurm (#30): each GPU ranked by its job's partition,
from ``squeue --json``.

What this Slurm (22.05, ``AccountingStorageType=accounting_storage/none``, as start.sh runs it) allows:
a QOS exists only in the accounting database (``sacctmgr add qos`` answers "Only
'accounting_storage/slurmdbd' is supported"), so ``sbatch --qos=high`` is accepted and ignored and
``squeue --json`` reports every job's ``qos`` as ``""``; partitions are slurm.conf's own, so two jobs in
partitions ``train`` and ``gpu`` are what ranks here. The QOS path is the same code on the same JSON field
(tests/controller/test_power_budget.py ranks by it from squeue-shaped JSON).
"""

from __future__ import annotations

import pathlib

import pytest

from healer import config
from healer.actuators import slurm
from healer.bus import embedded
from healer.controller.inventory import jobs
from tests.controller.conftest import Harness
from tests.controller.test_power_e2e import a_priority_episode, assert_only_the_low_job_capped, fleet_rig
from tests.slurm.cluster import SlurmCluster
from tests.slurm.test_slurm_actuator import cluster, job_state, submit  # noqa: F401

pytestmark = pytest.mark.slurm


async def test_squeue_says_each_jobs_partition_and_without_accounting_no_qos(
    cluster: SlurmCluster,  # noqa: F811
) -> None:
    train = submit(cluster, "-w", "gpu01", "-p", "train", "--qos=high")
    actuator = slurm.SlurmActuator(config.ActuatorSettings(slurm_conf=str(cluster.conf), call_timeout_s=20))
    listed = await actuator.jobs()
    assert listed[train]["qos"] == "", "no QOS without accounting, even one asked for"
    assert jobs.infos_from_squeue(listed)[train] == jobs.JobInfo(partition="train")


async def test_priority_caps_the_job_of_the_lower_partition_first_on_slurm(
    cluster: SlurmCluster,  # noqa: F811
    nats_server: embedded.EmbeddedServer,
    tmp_path: pathlib.Path,
) -> None:
    """Two jobs on one rack, in partitions ``train`` (gpu01, rank 2) and ``gpu`` (gpu02, rank 1): only
    gpu02's GPUs are capped, though gpu02's node label says ``priority: high``."""
    train = submit(cluster, "-w", "gpu01", "-p", "train")
    batch = submit(cluster, "-w", "gpu02", "-p", "gpu")
    actuator = slurm.SlurmActuator(config.ActuatorSettings(slurm_conf=str(cluster.conf), call_timeout_s=20))
    harness = Harness(nats_server, tmp_path)
    await harness.setup()
    try:
        async with fleet_rig(harness, ["gpu01", "gpu02"]) as rig:
            ranks = {"partition": {"train": 2, "gpu": 1}}
            ctl, data = await a_priority_episode(rig, tmp_path, actuator, ranks, low="gpu02")
            assert_only_the_low_job_capped(rig, data, "gpu02", f"1 (job {batch}: partition gpu)")
            assert ctl.learning.failslow is not None
            assert ctl.learning.failslow.jobs.info_at("gpu01", 0) == (train, jobs.JobInfo(partition="train"))
    finally:
        await harness.close()
    assert [job_state(cluster, j)[0] for j in (train, batch)] == ["RUNNING"] * 2, "no job stopped"
