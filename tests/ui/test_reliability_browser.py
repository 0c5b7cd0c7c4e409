"""The verdict buttons and the reliability tab in a real browser (Debian's headless chromium) on a page with
a token and a real nats-server: a click on "false alarm" goes onto the feed and comes back to the page;
the tab draws the last 7 days of a simulated fleet's archive (healer/evals/archive_truth.py) with both
plots, logging no error and loading nothing from elsewhere. It saves ``reliability.png`` in its tmp dir
(docs/img/ui-reliability.png is that picture)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import pathlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from healer import config
from healer.archive import store
from healer.bus import embedded
from healer.bus import nats as natsbus
from healer.evals import archive_truth as at
from healer.schemas import codec
from healer.ui import server
from tests.archive import test_truth
from tests.feed import helpers

pytestmark = [pytest.mark.browser, pytest.mark.nats, pytest.mark.slow]

TOKEN = "s3cret"


def truth_archive(path: pathlib.Path, start: float) -> at.Run:
    """The truth test's fleet, its five days ending at the last whole minute, archived as the consumer
    would (its feed written straight into the file)."""
    run = test_truth.simulated(dataclasses.replace(test_truth.SETTINGS, start=start))
    with store.Archive(path) as db:
        for seq, ev in enumerate(at.feed(run), 1):
            db.add_incident(ev, codec.encode(ev), seq)
        db.commit()
    return run


async def until(what: str, check: Callable[[], Awaitable[Any]], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"page: {what} did not happen within {timeout} s (last: {value!r})")
        await asyncio.sleep(0.2)


async def test_a_verdict_click_reaches_the_feed_and_the_tab_draws_the_week(
    browser: Any, nats_server: embedded.EmbeddedServer, nats_bus: natsbus.NatsBus, tmp_path: pathlib.Path
) -> None:
    start = math.floor(time.time() / 60) * 60 - test_truth.SETTINGS.days * 86400.0
    run = truth_archive(tmp_path / "archive.db", start)
    await helpers.publish(nats_bus, helpers.event(7))  # inc-7, open, on gpu-node-1/3
    settings = config.Settings(
        nats=config.NatsSettings(url=nats_server.url),
        ui=config.UiSettings(port=0, token=TOKEN, archive_db=str(tmp_path / "archive.db"), feed_window_s=600),
    )
    ui_bus = await natsbus.NatsBus.connect(nats_server.url, name="ui")
    running = await server.start(ui_bus, settings)

    def js(script: str, *args: Any) -> Awaitable[Any]:
        return asyncio.to_thread(browser.execute_script, script, *args)

    try:
        await asyncio.to_thread(browser.get, f"{running.url}?token={TOKEN}")
        await until("the incident", lambda: js("return document.querySelectorAll('#incidents li').length"))
        await until(
            "the page knows it takes verdicts", lambda: js("return window.healerVerdicts.state.enabled")
        )
        await js("document.querySelector('#incidents li').click()")
        await js("document.querySelector('.details .verdict-by').value = 'ana'")
        await js("document.querySelector('.details .verdict-false-alarm').click()")
        said = "return document.querySelector('.details .verdict-said').textContent.startsWith(arguments[0])"
        await until("the verdict shown", lambda: js(said, "false alarm by ana"))
        feed = "return [...document.querySelectorAll('#feed .change')].some(e => e.textContent === 'verdict')"
        await until("the verdict back from the feed", lambda: js(feed))

        await js("document.getElementById('tab-reliability').click()")
        tables = "return document.querySelectorAll('#rel-body .rel-table').length"
        assert await until("the reliability tab", lambda: js(tables)) >= 2
        assert await js("return document.getElementById('map-section').hidden") is True
        assert await js("return document.querySelectorAll('#rel-body svg').length") == 2
        bars = "return document.querySelectorAll('#rel-body svg rect').length"
        assert await js(bars) > 5
        headline = await js("return document.querySelector('.rel-head').textContent")
        assert f"{len(run.faults)}incidents" in headline.replace(" ", "")
        origins = await js("return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)")
        assert set(origins) <= {running.url.rstrip("/")}
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []
        await asyncio.to_thread(browser.set_window_size, 1500, 1250)
        await asyncio.to_thread(browser.save_screenshot, str(tmp_path / "reliability.png"))
    finally:
        await running.stop()
        await ui_bus.close()
