"""The event watchers' counts on the agent's /metrics: real kmsg records written to a file the real
KmsgWatcher follows, the real XidWatcher on the fake NVML, and the dedupe that joins them; each count
read back from the agent's Prometheus registry as a scrape would."""

from __future__ import annotations

import errno
import os
import pathlib
import queue
from collections.abc import Iterator

import prometheus_client as prom
import pytest
from prometheus_client import parser as prom_parser

from healer.agent import daemon, exposition, watcher_metrics
from healer.bus import base
from healer.schemas import events
from healer.sim import node_source
from healer.telemetry import kernel_log, watchers, xid
from tests.fakes import fake_pynvml as fp
from tests.telemetry import test_kmsg as tk

GET_S = 10.0  # an upper bound for a queue get, never a duration being measured


def _scrape(m: exposition.AgentMetrics) -> dict[str, float]:
    """Every watcher series, as ``name{source}`` or ``name``, from the exposition text."""
    out: dict[str, float] = {}
    for family in prom_parser.text_string_to_metric_families(prom.generate_latest(m.registry).decode()):
        for s in family.samples:
            if s.name.startswith(("healer_agent_watcher_", "healer_agent_kmsg_")):
                key = f"{s.name}{{{s.labels['source']}}}" if "source" in s.labels else s.name
                out[key] = s.value
    return out


@pytest.fixture
def node(tmp_path: pathlib.Path) -> Iterator[tk.Node]:
    n = tk.Node(tmp_path)
    yield n
    n.src.close()


def _watched(node: tk.Node, *extra: xid.XidWatcher) -> tuple[exposition.AgentMetrics, watchers.Combined]:
    kmsg_watcher = kernel_log.KmsgWatcher(
        "n1", state_dir=node.state, path=node.log, resolve=node.src.gpu_at, boot_id_path=node.boot,
        poll_s=0.02,
    )  # fmt: skip
    combined = watchers.Combined([*extra, kmsg_watcher])
    m = exposition.AgentMetrics()
    m.watchers.attach(combined)
    combined.start(node.got.put)
    return m, combined


def test_a_healthy_agent_serves_every_watcher_series_at_zero() -> None:
    got = _scrape(exposition.AgentMetrics())
    by_source = [f"{name}_total{{{s}}}" for _, name, _ in watcher_metrics.BY_SOURCE for s in ("nvml", "kmsg")]
    kmsg_only = [f"{name}_total" for _, name, _ in watcher_metrics.KMSG]
    assert got == dict.fromkeys(by_source + kmsg_only, 0.0)
    assert "healer_agent_kmsg_overruns_total" in got
    assert "healer_agent_watcher_duplicates_total{kmsg}" in got


def test_kmsg_records_events_and_unparsed_xid_lines_are_counted(node: tk.Node) -> None:
    m, combined = _watched(node)
    try:
        node.write(
            "4,1,1000,-;NVRM: Xid (PCI:0000:28:00): seventy-nine, pid=1, name=x, a wording nobody knows",
            "6,2,2000,-;usb 1-1: new high-speed USB device",  # not NVIDIA's: read, not a failure
            *(tk.FIXTURES / "xid_fatal.kmsg").read_text().splitlines(),  # 3 XIDs in 5 records
            *(tk.FIXTURES / "sxid.kmsg").read_text().splitlines(),
        )
        got = [node.got.get(timeout=GET_S) for _ in range(5)]
    finally:
        combined.stop()
    assert [e.kind for e in got] == ["xid", "xid", "xid", "sxid", "sxid"]
    seen = _scrape(m)
    assert seen["healer_agent_watcher_events_total{kmsg}"] == 5
    assert seen["healer_agent_watcher_parse_failures_total{kmsg}"] == 1
    assert seen["healer_agent_kmsg_records_total"] == 2 + 5 + 2
    assert seen["healer_agent_watcher_events_total{nvml}"] == 0
    assert seen["healer_agent_kmsg_overruns_total"] == 0
    assert seen["healer_agent_watcher_failures_total{kmsg}"] == 0


def test_an_xid_seen_by_nvml_and_the_log_counts_one_duplicate_of_the_logs_copy(node: tk.Node) -> None:
    fake = fp.FakeNvml(8)
    m, combined = _watched(node, xid.XidWatcher("n1", fake.module(), wait_ms=20))
    try:
        fake.inject_xid(1, 79)
        assert node.xids(1) == [(1, 79)]
        node.write(tk._record(1, 0x28, 79), tk._record(2, 0x38, 48))
        assert node.xids(1) == [(2, 48)]
    finally:
        combined.stop()
    seen = _scrape(m)
    assert seen["healer_agent_watcher_events_total{nvml}"] == 1
    assert seen["healer_agent_watcher_events_total{kmsg}"] == 2  # handed on, one then dropped
    assert seen["healer_agent_watcher_duplicates_total{kmsg}"] == 1
    assert seen["healer_agent_watcher_duplicates_total{nvml}"] == 0


def test_an_nvml_xid_replaced_by_the_logs_line_counts_as_an_nvml_duplicate() -> None:
    stub, got = tk.Stub(), list[events.NodeEvent]()
    combined = watchers.Combined([stub], window_s=5.0, hold_s=60.0)
    m = exposition.AgentMetrics()
    m.watchers.attach(combined)
    combined.start(got.append)
    stub.emit(events.new("n1", "xid", gpu_index=2, xid=13, source="nvml"))
    stub.emit(events.new("n1", "xid", gpu_index=2, xid=13, source="kmsg", pid=4242))
    combined.stop()
    assert [e.source for e in got] == ["kmsg"]
    seen = _scrape(m)
    assert seen["healer_agent_watcher_duplicates_total{nvml}"] == 1
    assert seen["healer_agent_watcher_duplicates_total{kmsg}"] == 0


def test_a_kmsg_overrun_is_on_metrics(node: tk.Node, monkeypatch: pytest.MonkeyPatch) -> None:
    real_read, failed = os.read, list[int]()

    def read(fd: int, n: int) -> bytes:
        if not failed:
            failed.append(fd)
            raise OSError(errno.EPIPE, "Broken pipe")  # what /dev/kmsg says when the ring wrapped
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", read)  # the os.read that kernel_log calls
    m, combined = _watched(node)
    try:
        node.write(tk._record(5, 0x58, 13))
        assert node.xids(1) == [(4, 13)]
    finally:
        combined.stop()
    seen = _scrape(m)
    assert seen["healer_agent_kmsg_overruns_total"] == 1
    assert seen["healer_agent_kmsg_reopens_total"] == 0
    assert seen["healer_agent_watcher_failures_total{kmsg}"] == 0


def test_a_failed_read_reopens_the_log_without_replaying_it(
    node: tk.Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_read, fail = os.read, list[bool]()

    def read(fd: int, n: int) -> bytes:
        if fail:
            fail.clear()
            raise OSError(errno.EIO, "Input/output error")
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", read)  # the os.read that kernel_log calls
    m, combined = _watched(node)
    try:
        node.write(tk._record(1, 0x18, 79))
        assert node.xids(1) == [(0, 79)]
        fail.append(True)
        node.write(tk._record(2, 0x28, 48))
        assert node.xids(1) == [(1, 48)]  # record 1 was read again from the start and skipped
    finally:
        combined.stop()
    assert node.got.empty()
    seen = _scrape(m)
    assert seen["healer_agent_kmsg_reopens_total"] == 1
    assert seen["healer_agent_watcher_failures_total{kmsg}"] == 1
    assert seen["healer_agent_kmsg_skipped_total"] == 1
    assert seen["healer_agent_watcher_events_total{kmsg}"] == 2


def test_an_unreadable_kmsg_is_a_failure_on_metrics(tmp_path: pathlib.Path) -> None:
    w = kernel_log.KmsgWatcher("n1", state_dir=tmp_path, path=tmp_path / "missing")
    m = exposition.AgentMetrics()
    m.watchers.attach(w)
    w.start(lambda e: None)
    w.stop()
    assert _scrape(m)["healer_agent_watcher_failures_total{kmsg}"] == 1


def test_a_failed_nvml_wait_is_counted_and_its_event_too() -> None:
    fake = fp.FakeNvml(4)
    w = xid.XidWatcher("n1", fake.module(), wait_ms=20)
    m = exposition.AgentMetrics()
    m.watchers.attach(w)
    got: queue.Queue[events.NodeEvent] = queue.Queue()
    w.start(got.put)
    try:
        fake.wait_error = fp.NVML_ERROR_GPU_IS_LOST
        assert got.get(timeout=GET_S).kind == "gpu_lost"
        fake.inject_xid(3, 95)
        assert got.get(timeout=GET_S).xid == 95
    finally:
        w.stop()
    seen = _scrape(m)
    assert seen["healer_agent_watcher_failures_total{nvml}"] == 1
    assert seen["healer_agent_watcher_events_total{nvml}"] == 2


def test_the_agent_serves_the_counts_of_the_watcher_it_runs(node: tk.Node, tmp_path: pathlib.Path) -> None:
    kmsg_watcher = kernel_log.KmsgWatcher(
        "n1", state_dir=node.state, path=node.log, resolve=node.src.gpu_at, boot_id_path=node.boot,
        poll_s=0.02,
    )  # fmt: skip

    async def never() -> base.Bus:
        raise AssertionError("not connected in this test")

    m = exposition.AgentMetrics()
    daemon.Agent(
        node="n1", source=node_source.SimSource("n1"), connect=never, state_dir=tmp_path / "agent",
        watcher=watchers.Combined([kmsg_watcher]), metrics=m,
    )  # fmt: skip
    kmsg_watcher.start(node.got.put)
    try:
        node.write(tk._record(1, 0x18, 79))
        assert node.xids(1) == [(0, 79)]
    finally:
        kmsg_watcher.stop()
    assert _scrape(m)["healer_agent_watcher_events_total{kmsg}"] == 1
