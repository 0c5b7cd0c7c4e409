"""From the agent's NVML XID event to the cordon's call at the scheduler actuator (#43, item 2): real agent
processes on the fake NVML, a real nats-server, the real controller with a 10,000-node inventory.

    nice -n 10 .venv/bin/python benchmarks/agent_to_cordon.py [--processes 4] [--agents 10]

``--processes`` agent processes (spawned), each running ``--agents`` real ``daemon.Agent`` instances (the
agent's own code: its ``NvmlSource`` and ``XidWatcher`` on a ``tests/fakes/fake_pynvml`` of its own, its
frames every second, its durable event publish), one node each; the rest of the 10,000-node fleet is node
identities in the controller's inventory (no frames), as in ``healer bench burst``, with the same
settings (healer/evals/burst_bench.py: limits set to allow the faults). When every agent has sent a
frame, each process injects one fatal XID 48 per agent, one every ``--gap-s`` seconds (single faults,
not a burst). Each is timed from the moment the fake NVML is given the event (``inject_xid``: the
watcher's ``nvmlEventSetWait`` returns it at once) to the moment the controller's scheduler actuator is
asked to cordon that node (a recording actuator: no scheduler's own time). Both clocks are this machine's
``time.time()``.

The agents run with the kernel-log watcher off (``kmsg_watch: false``), so an NVML XID is published at
once; with it on (the default), the hold adds what the kernel line takes to arrive, up to
``xid_log_wait_s`` (benchmarks/xid_hold.py measures that hold on its own).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import structlog

from healer import config, testing
from healer.agent import daemon
from healer.bus import embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.controller.core import service
from healer.evals import burst_bench
from healer.telemetry import nvml, watchers, xid
from tests.fakes import fake_pynvml as fp

GPUS = 8


def _agents(url: str, nodes: list[str], state: str, gap_s: float, go: Any, result: Any) -> None:
    """One agent process: an ``Agent`` per node, then one XID per node, ``gap_s`` apart."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))

    async def main() -> dict[str, float]:
        bus = await natsbus.NatsBus.connect(url, name="bench-agents")
        fakes = {n: fp.FakeNvml(GPUS) for n in nodes}
        agents = [
            daemon.Agent(
                node=n, source=nvml.NvmlSource(n, nvml=fakes[n].module()), bus=bus,
                state_dir=pathlib.Path(state) / n, interval_s=1.0,
                watcher=watchers.Combined([xid.XidWatcher(n, fakes[n].module())], hold_s=0.0),
            )
            for n in nodes
        ]  # fmt: skip
        stop = asyncio.Event()
        tasks = [asyncio.create_task(a.run(stop)) for a in agents]
        await burst_bench._until(lambda: all(a.seq > 0 for a in agents), 60.0)
        result.put("ready")
        await asyncio.to_thread(go.get, True, 120)
        injected: dict[str, float] = {}
        for n in nodes:
            injected[n] = time.time()
            fakes[n].inject_xid(3, burst_bench.XID)
            await asyncio.sleep(gap_s)
        await asyncio.sleep(2.0)  # the last events published
        stop.set()
        await asyncio.wait(tasks, timeout=10)
        await bus.close()
        return injected

    result.put(asyncio.run(main()))


async def measure(url: str, processes: int, per: int, gap_s: float, work: pathlib.Path) -> list[float]:
    inventory = work / "inventory.yaml"
    burst_bench.write_inventory(inventory)
    timed = burst_bench.Timed(testing.RecordingActuator())
    bus = await natsbus.NatsBus.connect(url, name="bench-agent-controller")
    cfg = burst_bench.settings(url, "rules", inventory, burst_bench.FLEET)
    ctl = await service.build(cfg, bus, scheduler=timed, gpu=testing.RecordingGpuActuator())
    await ctl.start()
    ctx = multiprocessing.get_context("spawn")
    procs, gos, results = [], [], []
    step = burst_bench.FLEET // (processes * per)
    names = [burst_bench.node_name(i * step) for i in range(processes * per)]
    try:
        await burst_bench._until(lambda: ctl.role.took_over, 60.0)
        for p in range(processes):
            go, res = ctx.Queue(), ctx.Queue()
            nodes = names[p * per : (p + 1) * per]
            proc = ctx.Process(
                target=_agents, args=(url, nodes, str(work / f"agents{p}"), gap_s, go, res), daemon=True
            )
            proc.start()
            procs.append(proc)
            gos.append(go)
            results.append(res)
        for res in results:
            assert await asyncio.to_thread(res.get, True, 120) == "ready"
        for go in gos:  # staggered: the processes' faults interleave, one at a time
            go.put(True)
            await asyncio.sleep(gap_s / processes)
        injected: dict[str, float] = {}
        for res in results:
            injected.update(await asyncio.to_thread(res.get, True, 120))
        await burst_bench._until(lambda: all(("cordon", n) in timed.asked for n in names), 30.0)
    finally:
        for proc in procs:
            await asyncio.to_thread(proc.join, 15)
        await ctl.stop()
        await bus.close()
    return [timed.asked[("cordon", n)] - injected[n] for n in names if ("cordon", n) in timed.asked]


async def run(processes: int, per: int, gap_s: float) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp, embedded.EmbeddedServer(pathlib.Path(tmp) / "nats") as srv:
        b = await natsbus.NatsBus.connect(srv.url)
        await provision.ensure(b, subjects.Subjects(), config.NatsSettings())
        await b.close()
        return await measure(srv.url, processes, per, gap_s, pathlib.Path(tmp))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--agents", type=int, default=10, help="agents (nodes) per process")
    parser.add_argument("--gap-s", type=float, default=0.25, help="between two faults of one process")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    times = sorted(1000 * t for t in asyncio.run(run(args.processes, args.agents, args.gap_s)))
    n = args.processes * args.agents
    print(f"agent NVML XID -> cordon asked of the scheduler: {len(times)} of {n} nodes, 10,000-node fleet")
    if len(times) >= 2:
        q = statistics.quantiles(times, n=100, method="inclusive")
        print(
            f"p50 {statistics.median(times):.1f} ms  p99 {q[98]:.1f} ms  min {times[0]:.1f} ms"
            f"  max {times[-1]:.1f} ms"
        )


if __name__ == "__main__":
    main()
