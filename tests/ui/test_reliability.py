"""The status page's reliability tab (#42, item 4): ``GET /api/reliability`` is ``healer report``'s last 7
days, from the archive file when ``ui.archive_db`` is set, else from the incident feed the page reads
itself (a real nats-server); kept for ``ui.reliability_cache_s``; a missing source is a 503 saying why."""

from __future__ import annotations

import pathlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from healer import config
from healer.archive import figures, store
from healer.bus import embedded, subjects
from healer.bus import nats as natsbus
from healer.schemas import incidents
from healer.ui import board, fleet, live, reliability, server
from tests.archive import test_report
from tests.feed import helpers
from tests.ui import conftest

H = 3600.0


async def get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.get(url + "api/reliability") as r:
        body = await r.read()
        return r.status, orjson.loads(body) if r.status == 200 else body.decode()


async def page_on(ui: config.UiSettings, clock: list[float]) -> server.Running:
    rel = reliability.Reliability(None, subjects.Subjects(), ui, lambda: 100, clock=lambda: clock[0])
    return await server.serve(live.Live(fleet.Fleet(2), board.Board()), ui, figures=rel)


async def test_from_the_archive_the_tab_is_the_reports_last_seven_days_kept_for_a_while(
    tmp_path: pathlib.Path,
) -> None:
    path = test_report.build_archive(tmp_path / "archive.db")
    clock = [test_report.END]
    running = await page_on(config.UiSettings(port=0, archive_db=str(path), reliability_cache_s=60), clock)
    try:
        status, shown = await get(running.url)
        assert status == 200
        with store.Archive(path, readonly=True) as db:
            opts = figures.Options(
                end=test_report.END,
                since_s=7 * 86400.0,
                fleet_gpus=100,
                repeat_window_s=30 * 86400.0,
                fleet_source="the page's map",
            )
            expected = orjson.loads(orjson.dumps(figures.build(db, opts)))
        assert {
            k: v for k, v in shown.items() if k not in ("source", "archive_db", "computed_at")
        } == expected
        assert (shown["source"], shown["archive_db"], shown["computed_at"]) == (
            "archive",
            str(path),
            clock[0],
        )
        assert shown["totals"]["incidents"] == 5  # the hand-built archive's, worked out in test_report
        clock[0] += 30  # within the cache: the same figures, however the archive changed
        path.unlink()
        assert (await get(running.url))[1]["computed_at"] == test_report.END
        clock[0] += 60  # past it: computed again, and now there is no archive
        status, why = await get(running.url)
        assert status == 503
        gone = f"no archive at {path} (ui.archive_db; healer archive --db writes it)"
        assert why == f"healer ui: no reliability figures: {gone}\n"
    finally:
        await running.stop()


async def test_without_an_archive_or_a_bus_the_tab_says_it_has_no_source() -> None:
    running = await server.serve(live.Live(fleet.Fleet(2), board.Board()), config.UiSettings(port=0))
    try:
        status, why = await get(running.url)
    finally:
        await running.stop()
    assert (status, why) == (
        503,
        "healer ui: no reliability figures: this page has no bus to read the incident feed from\n",
    )


def lifecycle(
    n: int, opened: float, resolved: float | None, gpu: int | None = 0
) -> list[incidents.IncidentEvent]:
    out = []
    for k, (change, ts) in enumerate((("opened", opened), ("resolved", resolved))):
        if ts is None:
            continue
        ev = helpers.event(n, change=change, gpu_index=gpu)  # type: ignore[arg-type]
        data = ev.data.model_copy(
            update={
                "state": incidents.IncidentState.RESOLVED
                if change is incidents.Change.RESOLVED
                else incidents.IncidentState.OPEN
            }
        )
        built = incidents.build(event_id=f"ev-{n}-{k}", cluster="c", change=change, data=data, ts=ts)  # type: ignore[arg-type]
        out.append(built)
    return out


@pytest.fixture
async def page(nats_server: embedded.EmbeddedServer) -> AsyncIterator[server.Running]:
    async with conftest.serving(nats_server.url, config.UiSettings(port=0, feed_window_s=60)) as running:
        yield running


@pytest.mark.nats
async def test_without_an_archive_the_page_reads_the_feed_itself(
    page: server.Running, nats_bus: natsbus.NatsBus
) -> None:
    now = time.time()
    events = [
        *lifecycle(1, now - 5 * H, now - 3 * H),  # 2 GPU-hours
        *lifecycle(2, now - 2 * H, now - 1.5 * H),  # 0.5
        *lifecycle(3, now - 9 * 86400, now - 8 * 86400),  # before the 7 days: not in the figures
        *lifecycle(4, now - H, None, gpu=None),  # a node, still open: 1 h x 8 GPUs (no evidence of its count)
    ]
    for ev in events:
        await helpers.publish(nats_bus, ev)
    status, shown = await get(page.url)
    assert status == 200, shown
    assert shown["source"] == "feed"
    assert shown["assumptions"]["fleet_gpus_source"] == "nodes seen in the incidents x 8"  # no frames yet
    assert shown["totals"]["incidents"] == 3
    assert shown["totals"]["gpu_hours_lost"] == pytest.approx(2 + 0.5 + 8, abs=0.01)
    rows = {r["kind"]: r for r in shown["by_rule"]}
    gpu, node = rows["gpu"], rows["node"]
    assert (gpu["incidents"], gpu["open"], gpu["to_resolution"]["count"]) == (2, 0, 2)
    assert gpu["to_resolution"]["p90_s"] == pytest.approx(2 * H, abs=1)
    assert (node["incidents"], node["open"]) == (1, 1)
