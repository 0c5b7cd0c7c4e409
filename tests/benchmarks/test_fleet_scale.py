"""benchmarks/fleet_scale.py at toy size: three real nats-servers in a JetStream cluster, two shards of
two real ``healer controller`` processes, ``healer sim`` publishers, fatal XIDs injected, shard 0's
leader SIGKILLed mid-run. The figures are the benchmark's business; what is checked is that each one
comes from the run, that the standby took over, and that every injected fault got its action."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.nats, pytest.mark.slow]


@pytest.mark.timeout(300)
def test_fleet_scale_reports_the_failover_and_an_action_for_every_fault() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fleet_scale.py"), "--nodes", "20", "--shards", "2",
         "--publishers", "2", "--interval", "1", "--duration", "16", "--faults", "6", "--lease-ttl", "4",
         "--json"],
        capture_output=True, text=True, timeout=280, cwd=ROOT, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    report = json.loads(run.stdout)
    assert set(report) >= {"fleet", "shards", "faults", "failover", "frames", "nats", "publishers", "at_1hz"}
    assert report["fleet"]["nodes"] == 20
    assert report["fleet"]["controllers"] == 4

    faults = report["faults"]
    assert faults["injected"] == 6
    assert faults["acted"] == 6, faults
    assert faults["unacted"] == []
    assert faults["actions"] == ["cordon"]
    assert faults["p50_s"] is not None
    assert faults["p99_s"] is not None
    assert faults["during_failover"], "a fault was injected on shard 0 while it had no leader"
    assert all(f["latency_s"] is not None for f in faults["during_failover"]), "the standby acted on it"

    failover = report["failover"]
    assert failover["standby_took_over"]
    assert failover["killed"]["pid"] != failover["standby"]["pid"]
    assert str(failover["standby"]["pid"]) in failover["standby"]["holder"], "the lease names the standby"
    assert failover["lease_taken_after_s"] > 0
    assert failover["took_over_after_s"] >= failover["lease_taken_after_s"]

    roles = sorted(r["was"] for r in report["shards"])
    assert roles == ["leader", "leader, killed", "standby", "standby, took over"]
    for r in report["shards"]:
        assert r["cpu_s"] > 0
        assert r["fleet_frames_per_cpu_s"] > 0
        assert r["own_frames_ingested"] > 0
        assert r["rss_mib"] > 0
        assert r["kib_per_node"] > 0
    assert sum(r["shard_nodes"] for r in report["shards"] if r["pair"] == "a") == 20

    frames = report["frames"]
    assert frames["published"] > 0
    assert frames["controller_dropped"] == 0
    assert set(frames["not_ingested_by_surviving_processes"].values()) == {0}, "every frame reached them"

    servers = report["nats"]["servers"]
    assert len(servers) == 3
    assert all(s["cpu_s"] > 0 and s["rss_mib"] > 0 for s in servers)
    assert report["nats"]["cores_at_1hz"] > 0
    assert report["at_1hz"]["cores_per_shard_process"] > 0
