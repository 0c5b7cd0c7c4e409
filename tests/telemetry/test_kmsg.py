"""The kernel log as a telemetry source: NVIDIA's XID/SXID lines parsed from recorded kmsg records,
PCI addresses mapped to GPUs through (fake) NVML, no replay after a restart, overruns survived, and an
XID seen by NVML and the log passed once."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import queue
from collections.abc import Iterator

import pytest

from healer.schemas import events, xids
from healer.telemetry import kernel_log, kmsg, nvml, source, watchers, xid
from tests.fakes import fake_pynvml as fp

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "kmsg"
GET_S = 10.0  # an upper bound for a queue get, never a duration being measured


def _lines(name: str) -> list[kmsg.NvidiaLine]:
    out = []
    for line in (FIXTURES / name).read_text().splitlines():
        record = kmsg.parse_record(line)
        if record is not None and (found := kmsg.parse_nvidia(record.message)) is not None:
            out.append(found)
    return out


def test_kmsg_records_and_continuation_lines() -> None:
    record = kmsg.parse_record("3,1002,6781741548779,-;NVRM: Xid (PCI:0000:28:00): 79, pid=1, name=a, x")
    assert record == kmsg.Record("NVRM: Xid (PCI:0000:28:00): 79, pid=1, name=a, x", 1002, 3, 6781741548779)
    assert kmsg.parse_record(" SUBSYSTEM=pci") is None
    assert kmsg.parse_record("[ 12.5] hello") == kmsg.Record("hello")


def test_fatal_xid_lines_give_pci_code_pid_and_process() -> None:
    found = _lines("xid_fatal.kmsg")
    assert [(f.kind, str(f.pci), f.code, f.pid, f.process) for f in found] == [
        ("xid", "0000:28:00", 79, None, None),
        ("xid", "0000:38:00", 48, 2231, "python3"),
        ("xid", "0000:48:00", 95, 2231, "python3"),
    ]
    assert found[0].text == "GPU has fallen off the bus."


def test_reset_family_and_old_format_without_pci_prefix() -> None:
    found = _lines("xid_reset.kmsg")
    assert [(str(f.pci), f.code, f.pid, f.process) for f in found] == [
        ("0000:18:00", 109, 1797828, "pt_main_thread"),
        ("0000:28:00", 119, 3011, "nvidia-smi"),
        ("0000:38:00", 154, None, None),
        ("0000:48:00", 62, None, None),
    ]
    assert found[2].text.startswith("GPU recovery action changed")


def test_application_xids_keep_their_pids() -> None:
    assert [(f.code, f.pid) for f in _lines("xid_application.kmsg")] == [(13, None), (31, 4242), (43, 4343)]


def test_plain_dmesg_and_syslog_lines_parse_too() -> None:
    assert [(str(f.pci), f.code) for f in _lines("plain.log")] == [("0000:18:00", 79), ("0000:28:00", 31)]


def test_xid_74_registers_are_decoded_per_nvidias_hopper_table() -> None:
    found = _lines("xid_nvlink.kmsg")
    d74 = [f.details for f in found if f.code == 74]
    assert d74[0] == {"link": 14, "reg0": 0, "reg1": 0, "reg2": 0x10000, "reg3": 0, "reg4": 0, "reg5": 0,
                      "reg6": 0, "nvlink_class": "link_other"}  # fmt: skip
    assert (d74[1]["link"], d74[1]["nvlink_class"]) == (6, "link_hardware")  # reg0 bit 16
    assert (d74[2]["link"], d74[2]["nvlink_class"]) == (2, "ecc_threshold")  # reg4 bit 20
    assert kmsg.decode(74, "NVLink: fatal error detected on link 2") == {}


def test_nvlink5_xids_give_unit_fatality_link_and_words() -> None:
    d = {f.code: f.details for f in _lines("xid_nvlink.kmsg") if f.code != 74}
    assert d[145] == {"unit": "RLW", "fatal": False, "link": 3, "reg0": 4, "reg1": 1, "reg2": 0, "reg3": 0,
                      "reg4": 0, "reg5": 0, "reg6": 0}  # fmt: skip
    assert d[149] == {"unit": "NETIR", "fatal": True, "link": 11, "reg0": 0x10, "reg1": 0}


def test_sxid_lines_name_the_switch_severity_and_link() -> None:
    found = _lines("sxid.kmsg")
    assert [(f.kind, str(f.pci), f.code, f.details) for f in found] == [
        ("sxid", "0000:05:00", 12028, {"switch": "nvidia-nvswitch3", "fatal": False, "link": 32}),
        ("sxid", "0000:03:00", 20034, {"switch": "nvidia-nvswitch0", "fatal": True, "link": 30}),
    ]
    assert found[1].text == "Link 30 LTSSM Fault Up"


def test_nvml_maps_a_pci_address_to_the_gpu_index_and_uuid() -> None:
    fake = fp.FakeNvml(4)
    src = nvml.NvmlSource("n1", nvml=fake.module())
    assert src.gpu_at(kmsg.PciAddress(0, 0x28, 0)) is None  # not open yet
    src.open()
    try:
        assert src.gpu_at(kmsg.PciAddress(0, 0x28, 0)) == (1, fake.gpus[1].uuid)
        assert kmsg.PciAddress.parse(fake.gpus[3].bus_id) == kmsg.PciAddress(0, 0x48, 0)
        assert src.gpu_at(kmsg.PciAddress(0, 0x48, 0)) == (3, fake.gpus[3].uuid)
        assert src.gpu_at(kmsg.PciAddress(0, 0x05, 0)) is None  # an NVSwitch, not a GPU
    finally:
        src.close()


# -- the watcher ---------------------------------------------------------------------------------------
class Node:
    """A kmsg stand-in (a file the test appends records to), a boot id, and the agent's state dir."""

    def __init__(self, tmp: pathlib.Path) -> None:
        self.log = tmp / "kmsg"
        self.log.write_text("")
        self.boot = tmp / "boot_id"
        self.boot.write_text("boot-1\n")
        self.state = tmp / "state"
        self.got: queue.Queue[events.NodeEvent] = queue.Queue()
        self.fake = fp.FakeNvml(8)
        self.src = nvml.NvmlSource("n1", nvml=self.fake.module())
        self.src.open()

    def watcher(self) -> kernel_log.KmsgWatcher:
        w = kernel_log.KmsgWatcher(
            "n1", state_dir=self.state, path=self.log, resolve=self.src.gpu_at, boot_id_path=self.boot,
            poll_s=0.02,
        )  # fmt: skip
        w.start(self.got.put)
        return w

    def write(self, *lines: str) -> None:
        with self.log.open("a") as f:
            f.write("".join(line + "\n" for line in lines))

    def xids(self, n: int) -> list[tuple[int | None, int | None]]:
        return [((e := self.got.get(timeout=GET_S)).gpu_index, e.xid) for _ in range(n)]


@pytest.fixture
def node(tmp_path: pathlib.Path) -> Iterator[Node]:
    n = Node(tmp_path)
    yield n
    n.src.close()


def _record(seq: int, bus: int, code: int, rest: str = "pid=7, name=x, boom") -> str:
    return f"4,{seq},{seq * 1000},-;NVRM: Xid (PCI:0000:{bus:02x}:00): {code}, {rest}"


def test_watcher_turns_a_kmsg_line_into_an_xid_event_with_the_gpu(node: Node) -> None:
    w = node.watcher()
    try:
        node.write(*(FIXTURES / "xid_fatal.kmsg").read_text().splitlines())
        event, *rest = [node.got.get(timeout=GET_S) for _ in range(3)]
    finally:
        w.stop()
    assert [(e.gpu_index, e.xid, e.pid, e.process) for e in rest] == [
        (2, 48, 2231, "python3"),
        (3, 95, 2231, "python3"),
    ]
    assert (event.kind, event.xid, event.gpu_index, event.gpu_uuid) == ("xid", 79, 1, node.fake.gpus[1].uuid)
    assert (event.source, event.pci_bus_id, event.pid) == ("kmsg", "0000:28:00", None)
    assert (
        event.message == "XID 79 on GPU 1 (PCI 0000:28:00): GPU fell off the bus: GPU has fallen off the bus."
    )
    assert w.counts.records == 5  # continuation lines are part of their record


def test_watcher_emits_sxid_events_without_a_gpu(node: Node) -> None:
    w = node.watcher()
    try:
        node.write(*(FIXTURES / "sxid.kmsg").read_text().splitlines())
        got = [node.got.get(timeout=GET_S) for _ in range(2)]
    finally:
        w.stop()
    assert [(e.kind, e.xid, e.gpu_index, e.pci_bus_id) for e in got] == [
        ("sxid", 12028, None, "0000:05:00"),
        ("sxid", 20034, None, "0000:03:00"),
    ]
    assert got[1].details["fatal"] is True


def test_first_start_skips_the_existing_log(node: Node) -> None:
    node.write(_record(1, 0x18, 79))
    w = node.watcher()
    try:
        node.write(_record(2, 0x28, 48))
        assert node.xids(1) == [(1, 48)]
    finally:
        w.stop()


def test_restart_in_the_same_boot_never_replays(node: Node) -> None:
    w = node.watcher()
    try:
        node.write(_record(10, 0x18, 79), _record(11, 0x28, 48))
        assert node.xids(2) == [(0, 79), (1, 48)]
    finally:
        w.stop()
    assert json.loads((node.state / "kmsg.json").read_text()) == {"boot_id": "boot-1", "seq": 11}
    # The device hands a new reader the whole ring again; the file does the same from offset 0.
    node.write(_record(12, 0x38, 95))
    w = node.watcher()
    try:
        node.write(_record(13, 0x48, 64))
        assert node.xids(2) == [(2, 95), (3, 64)]
    finally:
        w.stop()
    assert w.counts.skipped >= 2
    assert node.got.empty()


def test_after_a_reboot_the_whole_ring_of_this_boot_is_read(node: Node) -> None:
    w = node.watcher()
    w.stop()
    node.boot.write_text("boot-2\n")
    node.log.write_text(_record(1, 0x18, 79) + "\n")  # a fresh ring, written before the agent started
    w = node.watcher()
    try:
        assert node.xids(1) == [(0, 79)]
    finally:
        w.stop()


def test_an_overrun_is_counted_and_reading_goes_on(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    real_read = os.read
    failed: list[int] = []

    def read(fd: int, n: int) -> bytes:
        if not failed:
            failed.append(fd)
            raise OSError(errno.EPIPE, "Broken pipe")
        return real_read(fd, n)

    monkeypatch.setattr(os, "read", read)  # the os.read that kernel_log calls
    w = node.watcher()
    try:
        node.write(_record(5, 0x58, 13))
        assert node.xids(1) == [(4, 13)]
    finally:
        w.stop()
    assert w.counts.overruns == 1


def test_an_unreadable_kmsg_leaves_the_agent_running_without_it(tmp_path: pathlib.Path) -> None:
    w = kernel_log.KmsgWatcher("n1", state_dir=tmp_path, path=tmp_path / "missing")
    w.start(lambda e: None)
    w.stop()
    assert w.counts.records == 0


class Stub:
    """A watcher whose events the test hands in (``emit`` runs on the test's thread)."""

    def __init__(self) -> None:
        self.sink: source.EventSink | None = None

    def start(self, sink: source.EventSink) -> None:
        self.sink = sink

    def stop(self) -> None:
        self.sink = None

    def emit(self, event: events.NodeEvent) -> None:
        assert self.sink is not None
        self.sink(event)


def _combined(**kw: float) -> tuple[watchers.Combined, Stub, list[events.NodeEvent], list[float]]:
    now = [100.0]
    stub, got = Stub(), list[events.NodeEvent]()
    combined = watchers.Combined([stub], clock=lambda: now[0], **kw)
    combined.start(got.append)
    return combined, stub, got, now


def test_an_xid_seen_by_nvml_and_the_log_becomes_one_event() -> None:
    combined, stub, got, now = _combined(window_s=5.0)
    stub.emit(events.new("n1", "xid", gpu_index=2, xid=79, source="nvml"))
    stub.emit(log_event := events.new("n1", "xid", gpu_index=2, xid=79, source="kmsg", pid=3))
    stub.emit(events.new("n1", "xid", gpu_index=3, xid=79, source="kmsg"))
    stub.emit(events.new("n1", "sxid", xid=12028))
    stub.emit(events.new("n1", "sxid", xid=12028))  # only XIDs are deduplicated
    now[0] += 5.0
    stub.emit(log_event)  # a new window: a new fault
    assert [(e.kind, e.gpu_index, e.source) for e in got] == [
        ("xid", 2, "nvml"), ("xid", 3, "kmsg"), ("sxid", None, None), ("sxid", None, None), ("xid", 2, "kmsg")
    ]  # fmt: skip
    assert combined.duplicates == 1


def test_an_nvml_xid_held_for_the_log_is_replaced_by_the_logs_richer_line() -> None:
    combined, stub, got, _ = _combined(window_s=5.0, hold_s=60.0)
    stub.emit(events.new("n1", "xid", gpu_index=2, xid=13, source="nvml"))
    assert got == []  # held, waiting for the log's line of the same fault
    stub.emit(events.new("n1", "xid", gpu_index=2, xid=13, source="kmsg", pid=4242))
    stub.emit(events.new("n1", "xid", gpu_index=2, xid=13, source="kmsg", pid=4242))  # a 2nd line
    assert [(e.source, e.pid) for e in got] == [("kmsg", 4242)]
    assert (combined.replaced, combined.duplicates) == (1, 1)
    stub.emit(events.new("n1", "xid", gpu_index=5, xid=48, source="nvml"))
    combined.stop()  # a hold cut short by stop() passes the event: never lost
    assert [(e.gpu_index, e.source) for e in got] == [(2, "kmsg"), (5, "nvml")]


def test_a_held_nvml_xid_is_passed_when_no_log_line_comes() -> None:
    got: queue.Queue[events.NodeEvent] = queue.Queue()
    stub = Stub()
    combined = watchers.Combined([stub], hold_s=0.01)
    combined.start(got.put)
    try:
        stub.emit(events.new("n1", "xid", gpu_index=1, xid=79, source="nvml"))
        assert got.get(timeout=GET_S).source == "nvml"
    finally:
        combined.stop()
    assert got.empty()


def test_combined_watcher_passes_each_watchers_events_through_one_dedupe(node: Node) -> None:
    fake = fp.FakeNvml(8)
    combined = watchers.Combined(
        [xid.XidWatcher("n1", fake.module(), wait_ms=20), node_watcher := _Unstarted(node)]
    )
    combined.start(node.got.put)
    try:
        fake.inject_xid(1, 79)
        assert node.xids(1) == [(1, 79)]
        node.write(_record(1, 0x28, 79), _record(2, 0x38, 48))
        assert node.xids(1) == [(2, 48)]  # the log's XID 79 on GPU 1 was the same fault
    finally:
        combined.stop()
    assert combined.duplicates == 1
    assert node_watcher.stopped


class _Unstarted:
    """A KmsgWatcher built for the node, started by the Combined under test."""

    def __init__(self, node: Node) -> None:
        self.inner = kernel_log.KmsgWatcher(
            "n1", state_dir=node.state, path=node.log, resolve=node.src.gpu_at, boot_id_path=node.boot,
            poll_s=0.02,
        )  # fmt: skip
        self.stopped = False

    def start(self, sink: source.EventSink) -> None:
        self.inner.start(sink)

    def stop(self) -> None:
        self.inner.stop()
        self.stopped = True


def test_the_kmsg_watcher_reads_the_xid_catalogue_at_start(node: Node) -> None:
    """As the NVML watcher: the catalogue's YAML is not read in the first XID's path (#43)."""
    xids.load.cache_clear()
    w = node.watcher()
    try:
        assert xids.load.cache_info().currsize == 1
    finally:
        w.stop()
