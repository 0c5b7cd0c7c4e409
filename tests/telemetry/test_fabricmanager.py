"""Fabric Manager's health from /proc (a directory laid out as /proc is), and the agent reporting it in
its frames on NVSwitch nodes only."""

from __future__ import annotations

import pathlib

from healer.agent import daemon
from healer.bus import base, memory, subjects
from healer.schemas import codec, telemetry
from healer.sim import node_source
from healer.telemetry import fabricmanager, source


def proc(tmp_path: pathlib.Path, processes: dict[int, str]) -> pathlib.Path:
    root = tmp_path / "proc"
    for pid, comm in processes.items():
        (root / str(pid)).mkdir(parents=True, exist_ok=True)
        (root / str(pid) / "comm").write_text(comm + "\n")
    (root / "self").mkdir(parents=True, exist_ok=True)
    return root


def test_the_daemon_is_found_by_its_process_name_and_then_followed_by_pid(tmp_path: pathlib.Path) -> None:
    now = [0.0]
    root = proc(tmp_path, {1: "systemd", 812: "nv-fabricmanager", 900: "sshd"})
    probe = fabricmanager.FabricManagerProbe(root, rescan_s=10, clock=lambda: now[0])
    assert probe.running()
    assert probe.pid == 812
    assert probe.running()
    assert probe.scans == 1, "a running daemon costs one read of its comm, no scan"
    (root / "812" / "comm").unlink()
    (root / "812").rmdir()
    assert not probe.running(), "the daemon exited: down at once"
    proc(tmp_path, {1300: "nv-fabricmanager"})
    now[0] = 5.0
    assert not probe.running(), "no rescan before rescan_s"
    now[0] = 10.0
    assert probe.running()
    assert probe.pid == 1300


def test_the_pid_file_is_tried_first_and_a_stale_one_falls_back_to_the_scan(tmp_path: pathlib.Path) -> None:
    root = proc(tmp_path, {77: "nv-fabricmanager", 78: "bash"})
    pid_file = tmp_path / "nv-fabricmanager.pid"
    pid_file.write_text("78\n")  # stale: that pid is another process now
    probe = fabricmanager.FabricManagerProbe(root, pid_file=pid_file)
    assert probe.running()
    assert probe.pid == 77


def test_no_such_process_is_down(tmp_path: pathlib.Path) -> None:
    assert not fabricmanager.FabricManagerProbe(proc(tmp_path, {1: "systemd"})).running()


class FabricSource(node_source.SimSource):
    """A simulated NVSwitch node: every GPU has joined the NVLink fabric."""

    def sample(self) -> source.Sample:
        s = super().sample()
        return source.Sample([g.model_copy(update={"fabric_state": 3, "fabric_status": 0}) for g in s.gpus])


async def frames_of(src: source.TelemetrySource, tmp_path: pathlib.Path, mode: str) -> telemetry.NodeFrame:
    subj = subjects.Subjects()
    bus = memory.MemoryBus()
    bus.add_stream(subj.stream_events, [subj.all_events])
    got: list[bytes] = []

    async def keep(msg: base.Msg) -> None:
        got.append(msg.data)

    await bus.subscribe(subj.all_telemetry, keep)
    probe = fabricmanager.FabricManagerProbe(proc(tmp_path, {1: "systemd"}))
    agent = daemon.Agent(
        node="n1", source=src, bus=bus, state_dir=tmp_path / "state", fabric_manager=probe,
        fabric_manager_mode=mode,
    )  # fmt: skip
    src.open()
    await agent._ensure_connected()
    await agent.tick()
    await bus.idle()
    await bus.close()
    return codec.decode_frame(got[-1])


async def test_an_nvswitch_node_reports_its_fabric_manager_down_others_report_nothing(
    tmp_path: pathlib.Path,
) -> None:
    nvswitch = await frames_of(FabricSource("n1", gpus=2), tmp_path / "a", "auto")
    assert (nvswitch.schema_, nvswitch.fabric_manager_up) == (telemetry.SCHEMA_V2, False)
    plain = await frames_of(node_source.SimSource("n1", gpus=2), tmp_path / "b", "auto")
    assert (plain.schema_, plain.fabric_manager_up) == (telemetry.SCHEMA, None), "no fabric: not checked"
    forced = await frames_of(node_source.SimSource("n1", gpus=2), tmp_path / "c", "on")
    assert forced.fabric_manager_up is False
    off = await frames_of(FabricSource("n1", gpus=2), tmp_path / "d", "off")
    assert off.fabric_manager_up is None
