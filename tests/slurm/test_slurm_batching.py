"""A burst's drains batched against the real Slurm (#43): one ``scontrol`` for concurrent drains, a
hostlist Slurm rejects as a whole still drains every good node, and the bad name fails alone with Slurm's
own text; each node's outcome is its own, and a retry does nothing twice."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from healer.actuators import base, batching, slurm
from tests.slurm.cluster import SlurmCluster
from tests.slurm.test_slurm_actuator import actuator, cluster, node_line, request, submit  # noqa: F401

pytestmark = pytest.mark.slurm


async def test_concurrent_drains_go_out_together_and_a_bad_name_fails_alone(
    cluster: SlurmCluster,  # noqa: F811
    actuator: slurm.SlurmActuator,  # noqa: F811
) -> None:
    nodes = ["gpu01", "gpu02", "gpu99", "gpu03"]  # gpu99: Slurm knows no such node
    # one incident's reason for all: one hostlist line, which Slurm rejects whole for gpu99
    outcomes = await asyncio.gather(*(actuator.apply(request("cordon", n)) for n in nodes))
    by_node = dict(zip(nodes, outcomes, strict=True))
    assert actuator.batch.drain.batches < len(nodes), "drains that arrive together go out together"
    for node in ("gpu01", "gpu02", "gpu03"):
        assert by_node[node].status == "done", by_node[node]
        assert node_line(cluster, node) == ("drained", "healer: inc-42 xid 79 on gpu 3")
    assert by_node["gpu99"].status == "failed-permanent"
    assert by_node["gpu99"].detail == "slurm_update error: Invalid node name specified"
    again = await asyncio.gather(*(actuator.apply(request("cordon", n)) for n in nodes))
    assert [o.status for o in again] == ["already-done", "already-done", "failed-permanent", "already-done"]


async def test_each_node_keeps_its_own_reason_and_an_unsafe_one_arrives_verbatim(
    cluster: SlurmCluster,  # noqa: F811
    actuator: slurm.SlurmActuator,  # noqa: F811
) -> None:
    nasty = "temp_c >= 90 \"hot\" $(reboot); State=RESUME 'x'"
    asks = [
        base.ActionRequest(incident_id="inc-1", kind="cordon", node="gpu01", summary="xid 48 on gpu 0"),
        base.ActionRequest(incident_id="inc-2", kind="cordon", node="gpu02", summary="xid 79 on gpu 5"),
        base.ActionRequest(incident_id="inc-3", kind="cordon", node="gpu04", summary=nasty),
    ]
    outcomes = await asyncio.gather(*(actuator.apply(a) for a in asks))
    assert [o.status for o in outcomes] == ["done", "done", "done"], outcomes
    assert node_line(cluster, "gpu01") == ("drained", "healer: inc-1 xid 48 on gpu 0")
    assert node_line(cluster, "gpu02") == ("drained", "healer: inc-2 xid 79 on gpu 5")
    assert node_line(cluster, "gpu04") == ("drained", f"healer: inc-3 {nasty}")
    resumed = await actuator.apply(base.ActionRequest(incident_id="inc-2", kind="uncordon", node="gpu02"))
    assert resumed.status == "done", "healer's own drain, by incident, is lifted as before"
    refused = await actuator.apply(base.ActionRequest(incident_id="inc-2", kind="uncordon", node="gpu01"))
    assert refused.status == "refused", "another incident's drain is not"


async def test_a_hostlist_slurm_rejects_whole_still_drains_every_good_node(
    cluster: SlurmCluster,  # noqa: F811
    actuator: slurm.SlurmActuator,  # noqa: F811
) -> None:
    reason = "healer: inc-7 xid 48 on gpu 1"
    scontrol = actuator._argv("scontrol")
    nodes = ("gpu01", "gpu99", "gpu03")
    items = [
        (n, reason, [*scontrol, "update", f"NodeName={n}", "State=DRAIN", f"Reason={reason}"]) for n in nodes
    ]
    assert batching.drain_script([(n, r) for n, r, _ in items]) == (
        f'update NodeName=gpu01,gpu99,gpu03 State=DRAIN Reason="{reason}"\n'
    )
    errors = await actuator.batch.drain_all(items)
    assert errors == ["", "slurm_update error: Invalid node name specified", ""]
    assert node_line(cluster, "gpu01") == ("drained", reason)
    assert node_line(cluster, "gpu03") == ("drained", reason)


async def test_concurrent_migrates_list_their_jobs_in_one_squeue_split_per_node(
    cluster: SlurmCluster,  # noqa: F811
    actuator: slurm.SlurmActuator,  # noqa: F811
) -> None:
    two = submit(cluster, "--requeue", "-N", "2")  # a host list such as gpu[01-02]: on both nodes
    one = submit(cluster, "--requeue")
    nodes = list(cluster.nodes)
    own = {n: cluster.run("squeue", "-h", "-w", n, "-o", "%i").stdout.split() for n in nodes}
    assert sum(two in ids for ids in own.values()) == 2
    assert sum(one in ids for ids in own.values()) == 1
    calls: list[list[str]] = []
    run = actuator._run_argv

    async def counted(argv: Sequence[str], stdin: str | None = None) -> slurm.Result:
        calls.append(list(argv))
        return await run(argv, stdin)

    actuator.batch._cmd = counted
    assert await actuator.batch.jobs_all(nodes) == [(own[n], "") for n in nodes]
    assert [c[1:] for c in calls] == [["-h", "-w", ",".join(nodes), "-o", "%i|%N"]], "one squeue"
    calls.clear()
    with_bad = await actuator.batch.jobs_all([*nodes, "gpu99"])  # Slurm rejects the list whole
    assert with_bad[:-1] == [(own[n], "") for n in nodes], "each known node's jobs, from its own squeue"
    assert with_bad[-1][0] == []
    assert "Invalid node name" in with_bad[-1][1], with_bad[-1]
    # one node of each job and one without any: each job is requeued by one migrate only
    movers = [next(n for n in nodes if two in own[n]), next(n for n in nodes if one in own[n])]
    movers.append(next(n for n in nodes if not own[n]))
    before = actuator.batch.jobs.batches
    outcomes = await asyncio.gather(*(actuator.apply(request("migrate", n)) for n in movers))
    assert actuator.batch.jobs.batches - before < len(movers), "their squeue went out together"
    requeued = [i.item for o in outcomes for i in o.items if i.status == "done"]
    assert sorted(requeued) == sorted({f"job {two}", f"job {one}"}), "each job requeued once"
    assert all(o.status == "done" for o in outcomes), outcomes


def test_host_lists_expand_as_slurm_prints_them() -> None:
    assert batching.expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert batching.expand_hostlist("r[1-2]-n[08-09]") == ["r1-n08", "r1-n09", "r2-n08", "r2-n09"]
    assert batching.jobs_by_node("7|gpu[01-02]\n8|gpu03\n9|\n", ["gpu02", "gpu03", "gpu04"]) == {
        "gpu02": ["7"], "gpu03": ["8"], "gpu04": []
    }  # fmt: skip
    for bad in ("gpu[01-03", "gpu]1[", "gpu[a-b]", "gpu[[1]]"):
        with pytest.raises(ValueError, match=r"bracket|range"):
            batching.expand_hostlist(bad)
    assert batching.jobs_by_node("7|gpu[3-1]\n", ["gpu01"]) is None, "an unreadable list: ask node by node"
