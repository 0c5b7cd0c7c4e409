"""The publisher process of ``healer bench controller``: a separate process (spawned, so it shares nothing
with the process it measures) that floods or paces a local nats-server with synthetic 8-GPU frames of
``nodes`` nodes, some of them faulty, in one burst per second or spread evenly over it (``--spread``), and
reports what it sent. ``templates`` builds each node's encoded frames once; only the timestamp is
replaced per send (``TS_MARK``).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from typing import Any

import structlog

from healer.bus import nats as natsbus
from healer.bus import subjects
from healer.controller.core import service
from healer.schemas import codec, telemetry
from healer.sim import node_source

TS_MARK = b"1111111111.25"
SEQ_MARK = 987654321
"""The frames' ``seq`` in the templates, replaced by the round (the controller drops a repeated seq)."""


def templates(nodes: int, faulty: set[int]) -> list[tuple[str, bytes, bytes | None]]:
    gpus = node_source.SimSource("bench", gpus=8, seed=1).sample().gpus
    bad = [g.model_copy(update={"ecc_dbe_volatile": 1}) if g.index == 3 else g for g in gpus]
    out = []
    for i in range(nodes):
        node = f"gpu-{i:05d}"

        def enc(gs: list[telemetry.GpuSample], node: str = node) -> bytes:
            frame = telemetry.NodeFrame(
                node=node, ts=float(TS_MARK), seq=SEQ_MARK, boot_id="bench", agent_version="bench",
                source="sim", gpus_expected=8, gpus=gs,
            )  # fmt: skip
            return codec.encode(frame)

        out.append((node, enc(gpus), enc(bad) if i in faulty else None))
    return out


SPREAD_CHUNK = 100
"""With ``spread``, the paced publisher waits for its place in the second after every this many frames."""


def _publisher(
    url: str,
    nodes: int,
    seconds: float,
    rate_hz: float,
    faults: int,
    shards: int,
    result: Any,
    spread: bool = False,
) -> None:
    """A separate process: flood (rate_hz = 0) or pace frames, each round in one burst or ``spread``
    evenly over its period; inject faults (on nodes of shard 0 of ``shards``, the one measured); report
    what it did."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))

    async def main() -> dict[str, Any]:
        mine = [i for i in range(nodes) if service.shard_of(f"gpu-{i:05d}", shards) == 0]
        faulty = set(mine[:: max(1, len(mine) // max(1, faults))][:faults]) if faults else set()
        frames = templates(nodes, faulty)
        bus = await natsbus.NatsBus.connect(url, name="bench-publisher")
        subj = subjects.Subjects()
        subject_of = {node: subj.telemetry(node) for node, _, _ in frames}
        sent = 0
        injected: dict[str, float] = {}
        order = sorted(faulty)
        start = time.time()
        rnd = 0
        while time.time() - start < seconds:
            rnd += 1
            round_start = time.time()
            # after a 5-round baseline, one more node turns faulty every 2 rounds
            live_faults = set(order[: max(0, (rnd - 5) // 2)]) if rate_hz else set()
            seq = (b"%d" % SEQ_MARK, b"%d" % rnd)
            for i, (node, good, bad) in enumerate(frames):
                ts = time.time()
                use_bad = bad is not None and i in live_faults
                data = (bad if use_bad else good).replace(TS_MARK, f"{ts:.6f}".encode()).replace(*seq)  # type: ignore[union-attr]
                await bus.publish(subject_of[node], data)
                sent += 1
                if use_bad and node not in injected:
                    injected[node] = ts
                if spread and rate_hz and (i + 1) % SPREAD_CHUNK == 0:
                    # agents on their own clocks: this round's frames evenly over its period
                    due = round_start + (i + 1) / len(frames) / rate_hz
                    await asyncio.sleep(max(0.0, due - time.time()))
                elif sent % 500 == 0:
                    await asyncio.sleep(0)
            if rate_hz:
                await asyncio.sleep(max(0.0, 1.0 / rate_hz - (time.time() - round_start)))
        await bus.flush(10)
        await bus.close()
        return {"sent": sent, "seconds": time.time() - start, "injected": injected}

    result.put(asyncio.run(main()))


def start_publisher(
    url: str, nodes: int, seconds: float, rate_hz: float, faults: int, shards: int = 1, spread: bool = False
) -> tuple[Any, Any]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    args = (url, nodes, seconds, rate_hz, faults, shards, queue, spread)
    proc = ctx.Process(target=_publisher, args=args, daemon=True)
    proc.start()
    return proc, queue
