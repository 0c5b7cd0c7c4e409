"""The status page at fleet scale (default 10,000 nodes x 8 GPUs): what it costs the server, the wire and
the browser.

Server side, in this process: ingest per frame (the strict decoder plus the map's arrays and rings, on
real encoded frames), the snapshot (build time, bytes, gzipped bytes), and the change sets of the
following seconds while every GPU's temperature drifts (a random walk, sigma ``--noise-c`` per second) and
a few incidents open. Browser side, with Debian's headless chromium (selenium + chromium-driver, no
network): time from navigation to the first full map, a full redraw, applying one change set, JS heap.
No NATS is involved: the page is served from the same state the sources would fill.

    .venv/bin/python benchmarks/ui_scale.py [--nodes 10000] [--gpus 8] [--no-browser] [--screenshot PNG]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import pathlib
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson

from healer import config
from healer.schemas import codec, incidents, telemetry
from healer.sim import node_source
from healer.ui import board, fleet, live, server

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
)  # fmt: skip


def encoded_frames(nodes: int, gpus: int, temps: np.ndarray, now: float) -> list[tuple[str, bytes]]:
    """Real NodeFrame JSON per node (16 GPU sample sets shared, temperatures per node)."""
    base = [node_source.SimSource(f"v{v}", gpus=gpus, seed=v).sample().gpus for v in range(16)]
    out = []
    for i in range(nodes):
        node = f"gpu-{i:05d}"
        gs = [g.model_copy(update={"temp_c": float(temps[i, k])}) for k, g in enumerate(base[i % 16])]
        frame = telemetry.NodeFrame(
            node=node, ts=now, seq=1, boot_id="b", agent_version="bench", source="sim",
            gpus_expected=gpus, gpus=gs,
        )  # fmt: skip
        out.append((node, codec.encode(frame)))
    return out


def incident(i: int, node: str, gpu: int, now: float) -> incidents.IncidentEvent:
    data = incidents.IncidentData(
        incident_id=f"inc-bench-{i}", rule_id="gpu-overheating",
        severity=("warning", "major", "critical")[i % 3],
        node=node, gpu_index=gpu, state="open", summary="bench", evidence={"temp_c": 88.0},
        mode="enforce",
    )  # fmt: skip
    return incidents.IncidentEvent(
        id=f"inc-bench-{i}.1", source="healer://bench/controller", type=incidents.event_type("opened"),
        subject=f"node/{node}/gpu/{gpu}", time=datetime.fromtimestamp(now, tz=UTC), data=data,
    )  # fmt: skip


def server_side(args: argparse.Namespace) -> tuple[live.Live, dict[str, Any], list[tuple[str, Any]]]:
    rng = np.random.default_rng(1)
    now = time.time()
    temps = rng.normal(62, 6, (args.nodes, args.gpus)).clip(30, 90)
    lv = live.Live(fleet.Fleet(args.gpus, ring_len=90), board.Board(), stale_after_s=1e9)
    lv.extra_labels = {f"gpu-{i:05d}": {"rack": f"r{i // 40:03d}"} for i in range(args.nodes)}
    frames = encoded_frames(args.nodes, args.gpus, temps, now)
    for node, data in frames:  # first sight: rows allocated
        lv.fleet.ingest(node, codec.decode_frame_view(data), now)
    t0 = time.perf_counter()
    views = [(node, codec.decode_frame_view(data)) for node, data in frames]
    decode_us = (time.perf_counter() - t0) / len(frames) * 1e6
    t0 = time.perf_counter()
    for node, view in views:
        lv.fleet.ingest(node, view, now)
    ingest_us = (time.perf_counter() - t0) / len(frames) * 1e6
    for i in range(args.incidents):
        lv.board.apply(incident(i, f"gpu-{rng.integers(args.nodes):05d}", int(rng.integers(args.gpus)), now))
    t0 = time.perf_counter()
    snap = lv.snapshot(now, rebase=True)
    snap_ms = (time.perf_counter() - t0) * 1e3
    raw = orjson.dumps(snap)
    results: dict[str, Any] = {
        "nodes": args.nodes,
        "gpus": args.gpus,
        "decode_us_per_frame": round(decode_us, 1),
        "ingest_us_per_frame": round(ingest_us, 1),
        "snapshot_ms": round(snap_ms, 1),
        "snapshot_bytes": len(raw),
        "snapshot_gzip_bytes": len(gzip.compress(raw, 6)),
        "ring_mib": round(lv.fleet.ring.nbytes / 2**20, 1),
    }
    deltas: list[tuple[str, Any]] = []
    sizes, costs = [], []
    for tick in range(args.ticks):
        temps = (temps + rng.normal(0, args.noise_c, temps.shape)).clip(30, 95)
        t = now + tick + 1
        lv.fleet.temp[: args.nodes] = temps  # the map's latest readings, as ingest would set them
        lv.fleet.seen_at[: args.nodes] = t
        if tick == 3:
            lv.board.apply(incident(10_000, "gpu-00042", 3, t))
        t0 = time.perf_counter()
        out = lv.cells(t)
        costs.append((time.perf_counter() - t0) * 1e3)
        if out is not None:
            sizes.append(len(live.sse(*out)))
            deltas.append(out)
    results["cells_ms_median"] = round(statistics.median(costs), 1)
    results["cells_bytes_median"] = int(statistics.median(sizes)) if sizes else 0
    results["cells_bytes_max"] = max(sizes, default=0)
    results["cells_changed_median"] = (
        int(statistics.median(len(d[1].get("i", [])) for d in deltas)) if deltas else 0
    )
    return lv, results, deltas


async def browser_side(
    lv: live.Live, deltas: list[tuple[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    running = await server.serve(lv, config.UiSettings(port=0))
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="healer-ui-bench-"))
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for flag in (*FLAGS, "--window-size=1500,950", f"--user-data-dir={tmp / 'profile'}"):
        options.add_argument(flag)
    driver = await asyncio.to_thread(
        webdriver.Chrome, service=Service(shutil.which("chromedriver") or "chromedriver"), options=options
    )

    async def js(script: str) -> Any:
        return await asyncio.to_thread(driver.execute_script, script)

    try:
        t0 = time.perf_counter()
        await asyncio.to_thread(driver.get, running.url)
        await until(lambda: js("return !!(window.healerUi && window.healerUi.state.ready)"))
        wall_ms = (time.perf_counter() - t0) * 1e3
        ready_ms = await js("return window.healerUi.state.readyAt")
        first_draw = await js("return window.healerUi.state.renderMs")
        redraws = [await js("return window.healerUi.redraw()") for _ in range(5)]
        apply_ms = []
        for kind, payload in deltas[:5]:
            if kind != "cells":
                continue
            before = await js("return window.healerUi.state.cellsMsgs")
            lv.broadcast(kind, payload)
            await until(lambda n=before: js(f"return window.healerUi.state.cellsMsgs > {n}"))
            apply_ms.append(await js("return window.healerUi.state.cellsMs"))
        heap = await js("return performance.memory ? performance.memory.usedJSHeapSize : null")
        if args.screenshot:
            await asyncio.to_thread(driver.save_screenshot, args.screenshot)
        logs = await asyncio.to_thread(driver.get_log, "browser")
        return {
            "browser_load_to_map_ms": round(ready_ms),
            "browser_wall_to_map_ms": round(wall_ms),
            "browser_first_draw_ms": round(first_draw),
            "browser_redraw_ms_median": round(statistics.median(redraws)),
            "browser_apply_cells_ms_median": round(statistics.median(apply_ms), 1) if apply_ms else None,
            "browser_js_heap_mib": round(heap / 2**20, 1) if heap else None,
            "browser_console_errors": len([e for e in logs if e["level"] == "SEVERE"]),
        }
    finally:
        await asyncio.to_thread(driver.quit)
        await running.stop()
        shutil.rmtree(tmp, ignore_errors=True)


async def until(check: Any, timeout: float = 120.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():  # noqa: ASYNC110 - the state is in the browser
            await asyncio.sleep(0.02)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--incidents", type=int, default=20)
    p.add_argument("--ticks", type=int, default=10)
    p.add_argument("--noise-c", type=float, default=0.5)
    p.add_argument("--no-browser", action="store_true")
    p.add_argument("--screenshot")
    args = p.parse_args()
    lv, results, deltas = server_side(args)
    if not args.no_browser:
        results.update(asyncio.run(browser_side(lv, deltas, args)))
    width = max(len(k) for k in results)
    for k, v in results.items():
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    main()
