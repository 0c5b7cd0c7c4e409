"""XidWatcher against the fake pynvml: XIDs and double-bit ECC events reach the sink; stop() ends it."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import pytest

from healer.schemas import events, xids
from healer.telemetry import xid
from tests.fakes import fake_pynvml as fp

WAIT_MS = 20
GET_S = 10.0  # an upper bound for a queue get, never a duration being measured


@pytest.fixture
def fake() -> fp.FakeNvml:
    return fp.FakeNvml(4)


@pytest.fixture
def got() -> queue.Queue[events.NodeEvent]:
    return queue.Queue()


@pytest.fixture
def watcher(fake: fp.FakeNvml, got: queue.Queue[events.NodeEvent]) -> Iterator[xid.XidWatcher]:
    w = xid.XidWatcher("gpu-node-1", fake.module(), wait_ms=WAIT_MS)
    w.start(got.put)
    yield w
    w.stop()


def test_injected_xid_reaches_the_sink_as_a_node_event(
    watcher: xid.XidWatcher, fake: fp.FakeNvml, got: queue.Queue[events.NodeEvent]
) -> None:
    fake.inject_xid(2, 79)
    event = got.get(timeout=GET_S)
    assert (event.kind, event.node, event.gpu_index, event.xid) == ("xid", "gpu-node-1", 2, 79)
    assert event.gpu_uuid == fake.gpus[2].uuid
    assert "fell off the bus" in event.message  # the catalogue's name
    assert event.source == "nvml"
    assert events.NodeEvent.model_validate_json(event.model_dump_json()) == event


def test_double_bit_ecc_event_is_reported_as_xid_48(
    watcher: xid.XidWatcher, fake: fp.FakeNvml, got: queue.Queue[events.NodeEvent]
) -> None:
    fake.inject_dbe(1)
    event = got.get(timeout=GET_S)
    assert (event.kind, event.gpu_index, event.xid) == ("xid", 1, 48)
    assert "double-bit ECC" in event.message


def test_every_event_is_delivered_in_order_with_a_unique_id(
    watcher: xid.XidWatcher, fake: fp.FakeNvml, got: queue.Queue[events.NodeEvent]
) -> None:
    for n in (13, 31, 43):
        fake.inject_xid(0, n)
    delivered = [got.get(timeout=GET_S) for _ in range(3)]
    assert [e.xid for e in delivered] == [13, 31, 43]
    assert len({e.id for e in delivered}) == 3


def test_gpu_that_cannot_register_is_skipped_and_the_rest_are_watched(
    fake: fp.FakeNvml, got: queue.Queue[events.NodeEvent]
) -> None:
    fake.gpus[0].unsupported.add("nvmlDeviceRegisterEvents")
    fake.gpus[3].supported_events = fp.nvmlEventTypeSingleBitEccError  # neither XID nor DBE
    fake.gpus[1].supported_events = fp.nvmlEventTypeXidCriticalError  # XID only: registered for that
    w = xid.XidWatcher("n", fake.module(), wait_ms=WAIT_MS)
    w.start(got.put)
    try:
        assert w.watching == [1, 2]
        fake.inject_xid(1, 94)
        assert got.get(timeout=GET_S).xid == 94
    finally:
        w.stop()


def test_gpu_lost_during_wait_is_one_gpu_lost_event_and_watching_goes_on(
    watcher: xid.XidWatcher, fake: fp.FakeNvml, got: queue.Queue[events.NodeEvent]
) -> None:
    fake.wait_error = fp.NVML_ERROR_GPU_IS_LOST
    lost = got.get(timeout=GET_S)
    assert lost.kind == "gpu_lost"
    fake.inject_xid(3, 95)
    after = got.get(timeout=GET_S)
    assert (after.kind, after.xid) == ("xid", 95)


def test_a_failing_sink_does_not_end_the_watcher(
    fake: fp.FakeNvml, got: queue.Queue[events.NodeEvent]
) -> None:
    calls = []

    def sink(event: events.NodeEvent) -> None:
        calls.append(event)
        if len(calls) == 1:
            raise RuntimeError("sink broke")
        got.put(event)

    w = xid.XidWatcher("n", fake.module(), wait_ms=WAIT_MS)
    w.start(sink)
    try:
        fake.inject_xid(0, 13)
        fake.inject_xid(0, 43)
        assert got.get(timeout=GET_S).xid == 43
    finally:
        w.stop()


def test_stop_joins_the_thread_frees_the_set_and_releases_nvml(fake: fp.FakeNvml) -> None:
    w = xid.XidWatcher("n", fake.module(), wait_ms=WAIT_MS)
    w.start(lambda e: None)
    thread = w._thread
    assert thread is not None
    assert thread.is_alive()
    assert thread.daemon
    w.stop()
    assert not thread.is_alive()
    assert fake.event_sets[0].freed
    assert fake.init_count == 0
    w.stop()  # twice is fine
    assert fake.calls["nvmlEventSetFree"] == 1


def test_no_gpu_accepting_events_starts_no_thread(fake: fp.FakeNvml) -> None:
    for gpu in fake.gpus:
        gpu.unsupported.add("nvmlDeviceRegisterEvents")
    w = xid.XidWatcher("n", fake.module(), wait_ms=WAIT_MS)
    w.start(lambda e: None)
    assert w._thread is None
    assert w.watching == []
    assert fake.init_count == 0
    assert fake.event_sets[0].freed


def test_the_xid_catalogue_is_read_at_start_not_by_the_first_xid(fake: fp.FakeNvml) -> None:
    """Reading the catalogue's YAML took 30-100 ms of the first XID's path in each agent (#43): the watcher
    reads it when it starts, before any XID is waiting on it."""
    xids.load.cache_clear()
    w = xid.XidWatcher("gpu-node-1", fake.module(), wait_ms=WAIT_MS)
    try:
        w.start(lambda event: None)
        assert xids.load.cache_info().currsize == 1
    finally:
        w.stop()
