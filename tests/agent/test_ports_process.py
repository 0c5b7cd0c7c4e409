"""The RDMA port reader end to end: a real `healer agent` process pointed (``--sysfs-root``) at a recorded
sysfs tree publishes the ports to a real nats-server and serves them on /metrics; the tree then changes
under it as on a faulty node (a flap, an HCA gone) and the next frames say so."""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import urllib.request

from healer.bus import base, embedded
from healer.bus import nats as natsbus
from healer.schemas import codec, fabric, telemetry
from healer.telemetry import rdma
from tests import conftest

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"
HEALER = [sys.executable, "-m", "healer"]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


async def test_agent_process_reads_the_recorded_tree_publishes_ports_and_follows_faults(
    nats_server: embedded.EmbeddedServer, tmp_path: pathlib.Path
) -> None:
    root = rdma.write_tree((FIXTURES / "cx7-ib-healthy.txt").read_text(), tmp_path / "sys")
    expected = rdma.PortReader(root).read()
    bus = await natsbus.NatsBus.connect(nats_server.url, name="test")
    frames: list[telemetry.NodeFrame] = []

    async def got(msg: base.Msg) -> None:
        frames.append(codec.decode_frame(msg.data))

    await bus.subscribe("healer.telemetry.ib-node", got)
    metrics_port = embedded.free_port()
    agent = subprocess.Popen(  # noqa: ASYNC220 - started once, then only awaited on
        [*HEALER, "agent", "--nats", nats_server.url, "--node", "ib-node", "--source", "sim",
         "--sim-gpus", "2", "--interval", "0.1", "--state-dir", str(tmp_path / "state"),
         "--metrics-port", str(metrics_port), "--provision"],
        env={**os.environ, "HEALER_AGENT_SYSFS_ROOT": str(root), "HEALER_LOG_FORMAT": "json"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        await conftest.until(lambda: len(frames) >= 2, timeout=60)
        first = frames[-1]
        assert first.schema_ == telemetry.SCHEMA_V2
        assert first.ports == expected, "the frame carries exactly what the tree says"
        body = await asyncio.to_thread(scrape, metrics_port)
        assert 'node_infiniband_state_id{device="mlx5_3",port="1"} 4.0' in body
        assert 'node_infiniband_rate_bytes_per_second{device="mlx5_0",port="1"} 5e+10' in body

        rdma.write_tree((FIXTURES / "cx7-ib-flap.txt").read_text(), root)  # mlx5_2/1 flapped
        await conftest.until(lambda: _port(frames[-1], "mlx5_2/1").link_downed == 6, timeout=30)
        body = await asyncio.to_thread(scrape, metrics_port)
        assert 'node_infiniband_link_downed_total{device="mlx5_2",port="1"} 6.0' in body

        shutil.rmtree(root / "class/infiniband/mlx5_6")  # the HCA fell off the bus
        await conftest.until(lambda: len(frames[-1].ports or ()) == 7, timeout=30)
        assert "mlx5_6/1" not in {p.name for p in frames[-1].ports or ()}
    finally:
        agent.send_signal(signal.SIGTERM)
        out, _ = await asyncio.to_thread(agent.communicate, timeout=20)
        await bus.close()
    assert agent.returncode == 0, out.decode()[-2000:]


def _port(frame: telemetry.NodeFrame, name: str) -> fabric.PortSample:
    return next(p for p in frame.ports or () if p.name == name)
