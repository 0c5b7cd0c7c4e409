"""End to end: an XID line written to the agent's kernel-log source becomes, through a real nats-server
and a controller running the default XID rules, the right incident on the right GPU with the right
actions."""

from __future__ import annotations

import asyncio
import pathlib
import shutil

from healer import testing
from healer.agent import daemon
from healer.bus import nats as natsbus
from healer.telemetry import kernel_log, nvml, watchers
from tests.controller.conftest import Harness
from tests.fakes import fake_pynvml as fp

REPO = pathlib.Path(__file__).resolve().parents[2]
LINE = (
    "4,7001,9100000000,-;NVRM: Xid (PCI:0000:38:00): 109, pid=1797828, name=pt_main_thread, "
    "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005\n"
)


async def _until(predicate: object, polls: int = 400) -> None:
    """Poll every 0.05 s, at most ``polls`` times (an upper bound, never a duration being measured)."""
    assert callable(predicate)
    for _ in range(polls):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition never held")


async def test_a_kmsg_xid_line_becomes_the_right_incident_and_actions(
    harness: Harness, tmp_path: pathlib.Path
) -> None:
    shutil.copy(REPO / "rules" / "xid.yaml", harness.rules / "xid.yaml")
    actuator = testing.RecordingActuator()
    await harness.controller(actuator)

    fake = fp.FakeNvml(4)
    src = nvml.NvmlSource("n1", nvml=fake.module())
    kmsg_file, boot = tmp_path / "kmsg", tmp_path / "boot_id"
    kmsg_file.write_text("")
    boot.write_text("boot-1\n")
    state = tmp_path / "agent"
    watcher = kernel_log.KmsgWatcher(
        "n1", state_dir=state, path=kmsg_file, resolve=src.gpu_at, boot_id_path=boot, poll_s=0.02
    )
    bus = await natsbus.NatsBus.connect(harness.srv.url, name="agent-n1")
    agent = daemon.Agent(
        node="n1", source=src, bus=bus, state_dir=state, interval_s=0.1,
        watcher=watchers.Combined([watcher]),
    )  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await _until(lambda: agent.seq > 0 and watcher._thread is not None)
        with kmsg_file.open("a") as f:
            f.write(LINE)

        def opened() -> list[object]:
            return [e for e in harness.feed.events if e.change == "opened"]

        await _until(lambda: opened() and {"drain", "reset_gpu"} <= _acted(harness))
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await bus.close()

    incident = next(e for e in harness.feed.events if e.change == "opened").data
    assert (incident.rule_id, incident.node, incident.gpu_index) == ("xid-reset-required", "n1", 2)
    assert incident.gpu_uuid == fake.gpus[2].uuid
    assert incident.severity == "critical"
    assert incident.evidence["xid"] == 109
    assert "CTX SWITCH TIMEOUT" in str(incident.evidence["message"])
    assert (incident.evidence["pid"], incident.evidence["process"]) == (1797828, "pt_main_thread")
    assert (incident.evidence["source"], incident.evidence["pci_bus_id"]) == ("kmsg", "0000:38:00")
    assert [r.node for r in actuator.executed("cordon")] == ["n1"]  # drain is a cordon
    statuses = {a.kind: a.status for e in harness.feed.events for a in e.data.actions}
    assert statuses["reset_gpu"] == "skipped"  # not automated: the incident says so
    assert {e.data.rule_id for e in harness.feed.events} == {"xid-reset-required"}


def _acted(harness: Harness) -> set[str]:
    return {a.kind for e in harness.feed.events for a in e.data.actions}
