"""Agent cost: CPU seconds per 1,000 frames for an 8-GPU node, and the agent's resident memory.

Runs the real Agent.tick() path (sample in a worker thread, build and encode the NodeFrame, publish)
against the in-memory bus, once with the simulated source and once with NvmlSource over the test
tree's fake pynvml (the NVML library calls themselves cost nothing there; on a real GPU add the
driver's time, see docs/nvml.md), then a real `healer agent --source sim` process publishing to a real
nats-server at 10 frames/s, read from /proc. Prints one table; the ratio column compares each to the
10 ms/frame budget (1 % of one core at a 1 s interval). Last, the cost of one Prometheus scrape of the
agent's /metrics with the 8 GPUs' dcgm-exporter-named series, against the cost of one frame. And what
reading 8 HCAs adds to a frame: the simulated source again with the RDMA port reader pointed at the
recorded ConnectX-7 tree (tests/fixtures/sysfs/cx7-ib-healthy.txt, 8 InfiniBand ports), against the
1 ms budget of issue #26 (read, build and encode the ports; the kernel's own work behind a real sysfs
read is not in it).

    .venv/bin/python benchmarks/agent_cost.py [--frames 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import resource
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import prometheus_client
import structlog

from healer.agent import daemon, exposition
from healer.bus import embedded, memory, subjects
from healer.schemas import telemetry
from healer.sim import node_source
from healer.telemetry import nvml, rdma, source
from tests.fakes import fake_pynvml

BUDGET_MS = 10.0


PORTS_BUDGET_MS = 1.0
FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "sysfs"


async def measure(src: source.TelemetrySource, frames: int, ports: rdma.PortReader | None = None) -> float:
    subj = subjects.Subjects()
    bus = memory.MemoryBus()
    bus.add_stream(subj.stream_events, [subj.all_events])
    received = 0

    async def count(msg: object) -> None:
        nonlocal received
        received += 1

    await bus.subscribe(subj.all_telemetry, count)
    with tempfile.TemporaryDirectory() as state:
        agent = daemon.Agent(
            node="bench-node", source=src, bus=bus, state_dir=state, gpus_expected=8, ports=ports
        )
        src.open()
        await agent._ensure_connected()
        for _ in range(50):  # warm caches, first-read logging
            await agent.tick()
        await bus.idle()
        start = time.process_time()
        for _ in range(frames):
            await agent.tick()
        await bus.idle()
        cpu = time.process_time() - start
        src.close()
    await bus.close()
    assert received == frames + 50
    return cpu / frames * 1000.0


def scrape_cost(scrapes: int) -> tuple[float, int]:
    """(ms CPU per scrape of the agent's registry with 8 GPUs' readings, bytes per scrape)."""
    metrics = exposition.AgentMetrics()
    src = node_source.SimSource("bench-node", gpus=8, seed=1)
    frame = telemetry.NodeFrame(
        node="bench-node",
        ts=1.0,
        seq=0,
        boot_id="b",
        agent_version="bench",
        source="sim",
        gpus=src.sample().gpus,
    )
    metrics.gpu.observe(frame)
    size = len(prometheus_client.generate_latest(metrics.registry))
    start = time.process_time()
    for _ in range(scrapes):
        prometheus_client.generate_latest(metrics.registry)
    return (time.process_time() - start) / scrapes * 1000.0, size


def process_cost(seconds: float, interval_s: float) -> tuple[float, float, int]:
    """A real `healer agent --source sim` process publishing to a real nats-server:
    (ms CPU per frame, RSS MB at the end, frames)."""
    with tempfile.TemporaryDirectory() as tmp, embedded.EmbeddedServer(pathlib.Path(tmp) / "nats") as srv:
        proc = subprocess.Popen(
            [sys.executable, "-m", "healer", "agent", "--nats", srv.url, "--source", "sim", "--node", "bench",
             "--interval", str(interval_s), "--state-dir", str(pathlib.Path(tmp) / "state"), "--metrics-port",
             "0", "--provision"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(3.0)  # start-up (imports, connect) is not per-frame cost
            cpu0 = _cpu_s(proc.pid)
            time.sleep(seconds)
            cpu1 = _cpu_s(proc.pid)
            rss_mb = _rss_mb(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
    frames = int(seconds / interval_s)
    return (cpu1 - cpu0) / frames * 1000.0, rss_mb, frames


def _cpu_s(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frames", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the real process is measured")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    fake = fake_pynvml.FakeNvml(8).module()
    rows = [
        ("sim", asyncio.run(measure(node_source.SimSource("bench-node", gpus=8, seed=1), args.frames))),
        ("nvml (fake pynvml)", asyncio.run(measure(nvml.NvmlSource("bench-node", nvml=fake), args.frames))),
    ]
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    proc_ms, proc_rss, proc_frames = process_cost(args.seconds, 0.1)
    rows.append((f"sim, real process ({proc_frames} fr)", proc_ms))
    print(f"agent cost, 8 GPUs, {args.frames} frames each in-process; CPU time per frame")
    print(f"{'source':<30}{'ms CPU/frame':>14}{'CPU s/1000 frames':>20}{'of 10 ms budget':>18}")
    for name, ms in rows:
        print(f"{name:<30}{ms:>14.3f}{ms:>20.3f}{ms / BUDGET_MS:>17.1%}")
    print(f"peak RSS, in-process benchmark: {rss_mb:.0f} MB; real `healer agent` process: {proc_rss:.0f} MB")
    print("(target: < 10 ms CPU per frame, < 80 MB RSS)")
    with tempfile.TemporaryDirectory() as tree:
        rdma.write_tree((FIXTURES / "cx7-ib-healthy.txt").read_text(), tree)
        plain = asyncio.run(measure(node_source.SimSource("bench-node", gpus=8, seed=1), args.frames))
        reader = rdma.PortReader(tree)
        with_ports = asyncio.run(
            measure(node_source.SimSource("bench-node", gpus=8, seed=1), args.frames, reader)
        )
        assert len(reader.read()) == 8
    added = with_ports - plain
    print(
        f"8 HCAs (recorded ConnectX-7 tree): {with_ports:.3f} ms/frame with ports vs {plain:.3f} without:"
        f" +{added:.3f} ms = {added / PORTS_BUDGET_MS:.0%} of the {PORTS_BUDGET_MS:g} ms budget"
    )
    scrape_ms, scrape_bytes = scrape_cost(500)
    frame_ms = rows[0][1]
    print(
        f"one /metrics scrape (8 GPUs, dcgm-exporter names): {scrape_ms:.3f} ms CPU, {scrape_bytes} bytes"
        f" = {scrape_ms / frame_ms:.2f} x one sim frame's cost"
    )


if __name__ == "__main__":
    main()
