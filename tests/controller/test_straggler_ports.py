"""The port test (controller/failslow/straggler_ports.py): the node whose RDMA port is congested or erroring
against its job's other nodes' ports is named; a fabric-wide congestion, a single-node job and a healthy busy
port are not."""

from __future__ import annotations

import itertools

import numpy as np

from healer.controller.failslow import detector, straggler_ports, straggler_settings
from healer.schemas import telemetry

P = straggler_ports.NodePorts
HEALTHY = P(2_000.0, "mlx5_0/1", 0.0, "")
CONGESTED = P(3e7, "mlx5_3/1", 0.0, "")
S = straggler_ports.Settings()
T0 = 1_800_000_000.0


def test_the_leave_one_out_median_is_each_elements_group_median_without_it() -> None:
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 6, 60)
    values = rng.integers(0, 5, 60).astype(float)  # ties on purpose
    got = straggler_ports.loo_median(codes, values)
    for i in range(60):
        others = values[(codes == codes[i]) & (np.arange(60) != i)]
        if others.size:
            assert got[i] == np.median(others), i
        else:
            assert np.isnan(got[i])


def test_a_congested_port_names_its_node_against_the_jobs_other_nodes() -> None:
    ports = {"a": HEALTHY, "b": CONGESTED, "c": HEALTHY, "d": P(9_000.0, "mlx5_1/1", 0.0, "")}
    (lag,) = straggler_ports.port_lag({"j": ["a", "b", "c", "d"]}, ports, S)
    assert (lag.job, lag.node, lag.congested, lag.nodes) == ("j", "b", True, 4)
    assert lag.reference_wait_per_s == 2_000.0
    # a two-node job compares with the other node
    (lag,) = straggler_ports.port_lag({"j": ["a", "b"]}, ports, S)
    assert lag.node == "b"


def test_no_node_is_named_when_the_whole_job_waits_alike_or_alone_or_below_the_line() -> None:
    everywhere = dict.fromkeys("abcd", CONGESTED)  # the fabric, or the job's own traffic, everywhere
    assert straggler_ports.port_lag({"j": list("abcd")}, everywhere, S) == []
    both = {"a": CONGESTED, "b": P(4e7, "mlx5_0/1", 0.0, "")}  # two congested nodes of a two-node job
    assert straggler_ports.port_lag({"j": ["a", "b"]}, both, S) == []
    assert straggler_ports.port_lag({"j": ["b"]}, {"b": CONGESTED}, S) == []  # a single-node job
    busy = {"a": HEALTHY, "b": P(5e6, "mlx5_0/1", 0.0, ""), "c": HEALTHY}  # 2,500 x, but under 1e7
    assert straggler_ports.port_lag({"j": list("abc")}, busy, S) == []
    missing = {"a": HEALTHY, "b": CONGESTED}  # c and d sent no ports: a two-node comparison still
    assert [x.node for x in straggler_ports.port_lag({"j": list("abcd")}, missing, S)] == ["b"]


def test_an_erroring_port_names_its_node_only_while_the_others_are_clean() -> None:
    dirty = P(2_000.0, "mlx5_0/1", 40.0, "mlx5_5/1")
    (lag,) = straggler_ports.port_lag({"j": list("abc")}, {"a": HEALTHY, "b": dirty, "c": HEALTHY}, S)
    assert (lag.node, lag.congested, lag.ports.error_port) == ("b", False, "mlx5_5/1")
    all_dirty = dict.fromkeys("abc", dirty)
    assert straggler_ports.port_lag({"j": list("abc")}, all_dirty, S) == []


def test_a_node_is_named_after_persist_windows_and_a_window_without_its_ports_keeps_the_count() -> None:
    test = straggler_ports.PortTest()
    jobs = {"j": ["a", "b", "c"]}
    lagging = {"a": HEALTHY, "b": CONGESTED, "c": HEALTHY}
    assert test.score(jobs, lagging) == []
    assert test.pending() == {"j"}
    assert test.score(jobs, {"a": HEALTHY, "c": HEALTHY}) == []  # b's frame late: neither counts nor resets
    assert test.score({}, lagging) == []  # a checkpoint: no load on the job, neither counts nor resets
    assert test.score(jobs, lagging) == []
    ((lag, windows),) = test.score(jobs, lagging)
    assert (lag.node, windows) == ("b", 3)
    assert test.score(jobs, dict.fromkeys("abc", HEALTHY)) == []  # back to healthy: the count starts over
    assert test.pending() == set()
    for _ in range(2):
        test.score(jobs, lagging)
    for _ in range(straggler_ports.FORGET_WINDOWS + 1):  # the job ended: forgotten after a while
        test.score({}, {})
    assert test.pending() == set()
    assert test.score(jobs, lagging) == []


def _frame(node: str, ts: float, wait: int, symbols: int = 0) -> telemetry.NodeFrame:
    ports = [
        {
            "device": f"mlx5_{p}",
            "port": 1,
            "port_xmit_wait": wait if p == 2 else 100,
            "symbol_error": symbols if p == 1 else 0,
        }
        for p in range(4)
    ]
    return telemetry.NodeFrame.model_validate(
        {
            "schema": telemetry.SCHEMA_V2,
            "node": node,
            "ts": T0 + ts,
            "seq": int(ts),
            "boot_id": "b",
            "agent_version": "t",
            "source": "sim",
            "gpus": [],
            "ports": ports,
        }
    )


def test_the_port_watch_gives_each_nodes_worst_port_per_window_and_survives_a_counter_reset() -> None:
    watch = straggler_ports.PortWatch()
    watch.observe(_frame("a", 0.0, 0))
    assert watch.window() == {}  # the first window only sets the base
    watch.observe(_frame("a", 60.0, 6_000_000_000, symbols=3))
    got = watch.window()["a"]
    assert (got.wait_per_s, got.wait_port, got.errors, got.error_port) == (1e8, "mlx5_2/1", 3.0, "mlx5_1/1")
    watch.observe(_frame("a", 120.0, 600_000))  # a driver reload zeroed the counters: rise from 0
    got = watch.window()["a"]
    assert got.wait_per_s == 10_000.0
    assert got.errors == 0.0


def test_the_failslow_part_names_a_congested_node_of_a_job_as_one_node_straggler() -> None:
    fs = detector.FailSlow(straggler_settings.Settings(window_s=60.0, sample_every_s=5.0))
    for t, node in itertools.product(range(0, 301, 5), ("a", "b", "c")):
        gpus = [
            {
                "index": g,
                "util_gpu_pct": 97.0,
                "sm_clock_mhz": 1980.0,
                "sm_clock_max_mhz": 1980.0,
                "power_w": 650.0,
                "power_limit_w": 700.0,
                "jobs": ["77"],
            }
            for g in range(8)
        ]
        wait = 3 * 10**7 * t if node == "b" else 2_000 * t
        frame = _frame(node, float(t), wait).model_dump(by_alias=True)
        frame["gpus"] = gpus
        fs.observe(telemetry.NodeFrame.model_validate(frame))
        if node == "c":
            fs.tick(T0 + t)
    assert set(fs.scorer.stragglers) == {("b", None)}
    why = fs.explain("b", None)
    assert why["straggler.test"] == "port"
    assert why["straggler.port"] == "mlx5_2/1"
    assert why["straggler.port_xmit_wait_per_s"] == 3 * 10**7
    assert why["straggler.cause"] == "port_congested,ports_congested"
    assert fs.scorer.scores()["b"] == dict.fromkeys(range(8), 1.0)
    assert fs.scorer.scores()["a"] == dict.fromkeys(range(8), 0.0)
