"""The status page an SRE can trust (issue #23), in headless chromium against the real server, on the
fleet of ``tests.ui.scene``: every admitted node on the map from the first paint (the silent ones grey),
cordoned, drained and excluded nodes framed, stale readings labelled stale with their age, a missing
anomaly score shown as "no score", search by node and by GPU UUID, a per-node view with every GPU, its
XID and incident history, driver and VBIOS, charts reaching back over an hour, short timelines, Grafana
links, the node view never over the incident list, the breaker's node list, a rejected rule reload.

With ``HEALER_UI_SHOTS=DIR`` the screenshots are also written to DIR (docs/img has them)."""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from healer.ui import live, server
from tests.ui import conftest as ui_conftest
from tests.ui import scene
from tests.ui.test_browser import Page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

GREY = "#5a6068"
"""``node silent`` in the page's palette."""
TYPE_JS = """const s = document.getElementById('search'); s.focus(); s.value = arguments[0];
s.dispatchEvent(new Event('input')); s.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'}))"""
TEXT_JS = "return document.getElementById(arguments[0]).textContent"
TITLE_JS = """const p = document.getElementById('gpu-panel');
return !p.hidden && document.getElementById('gpu-title').textContent.startsWith(arguments[0])
  && document.querySelectorAll('#node-gpus tr').length > 1"""
OVERLAP_JS = """const a = document.getElementById('gpu-panel').getBoundingClientRect(),
b = document.querySelector('aside').getBoundingClientRect();
return a.right > b.left && b.right > a.left && a.bottom > b.top && b.bottom > a.top"""


@pytest.fixture
async def served() -> AsyncIterator[tuple[server.Running, live.Live]]:
    lv, ui = scene.build(time.time())
    running = await server.serve(lv, ui, anomaly=scene.MissingScore())
    try:
        yield running, lv
    finally:
        await running.stop()


async def shoot(driver: Any, tmp: pathlib.Path, name: str) -> None:
    path = tmp / name
    await asyncio.to_thread(driver.save_screenshot, str(path))
    assert path.stat().st_size > 10_000
    if os.environ.get("HEALER_UI_SHOTS"):
        shutil.copyfile(path, pathlib.Path(os.environ["HEALER_UI_SHOTS"]) / name)


async def test_a_page_an_sre_trusts(served: tuple[server.Running, live.Live], tmp_path: pathlib.Path) -> None:
    running, _lv = served
    driver = await asyncio.to_thread(ui_conftest.start_chromium, tmp_path, 1500, 1500)
    try:
        page = Page(driver)
        await asyncio.to_thread(driver.get, running.url)
        await page.until(
            "the snapshot", lambda: page.js("return !!(window.healerUi && window.healerUi.state.ready)")
        )
        # every admitted node from the first paint: the first snapshot already has them all
        assert await page.js("return window.healerUi.state.snapshots") == 1
        assert sorted(await page.js("return window.healerUi.state.nodes")) == scene.ALL
        for node in (scene.NEVER, scene.INVENTORY_ONLY, scene.STALE):
            assert await page.pixel(node, 0) == GREY, node  # silent: grey
        assert await page.pixel(scene.HOT, 0) != GREY
        marks = await page.js("return window.healerUi.markColours")
        for node, mark in (
            (scene.CORDONED, "cordoned"),
            (scene.DRAINED, "drained"),
            (scene.EXCLUDED, "excluded"),
        ):
            assert await page.js("return window.healerUi.framePixel(arguments[0])", node) == marks[mark], node
        assert (
            await page.js("return window.healerUi.framePixel(arguments[0])", "gpu-b01") not in marks.values()
        )
        legend = await page.js(TEXT_JS, "legend")
        assert "cordoned" in legend
        assert "drained" in legend
        assert "excluded" in legend
        # a rejected rule reload and the open breaker's nodes, in the safety panel
        rules = await page.js(TEXT_JS, "rules")
        assert "RULE RELOAD REJECTED" in rules
        assert "thermal.yaml:12:7" in rules
        assert scene.CORDONED in await page.js(TEXT_JS, "breaker")
        # the breaker incident's evidence lists its nodes, each a way into that node's view
        await page.js("document.querySelector(\"#incidents li[data-node='fleet']\").click()")
        buttons = await page.until(
            "the breaker's node list",
            lambda: page.js(
                "return [...document.querySelectorAll("
                "\"#incidents li[data-node='fleet'] .details td .node-link\")].map(b => b.textContent)"
            ),
        )
        assert buttons == [scene.CORDONED, scene.DRAINED, "gpu-b01", "gpu-b03"]
        await shoot(driver, tmp_path, "ui.png")

        # timelines are short: the long summary once, not on every line
        await page.js("document.querySelector(\"#incidents li[data-id='inc-hot']\").click()")
        cells = await page.until(
            "the timeline",
            lambda: page.js(
                "return [...document.querySelectorAll(\"#incidents li[data-id='inc-hot'] .details td\")]"
                ".map(t => t.textContent)"
            ),
        )
        assert max(len(c) for c in cells) <= 100, max(cells, key=len)
        assert sum(scene.LONG[:40] in c for c in cells) <= 1

        # search by node, then by GPU UUID, opens the node's view below the map, beside the incident list
        await page.js(TYPE_JS, scene.STALE)
        await page.until("the node view", lambda: page.js(TITLE_JS, f"{scene.STALE} / GPU 0"))
        assert not await page.js(OVERLAP_JS), "the node view covers the incident list"
        facts = await page.js(TEXT_JS, "node-facts")
        assert "STALE" in facts, facts
        assert "31 min ago" in facts, facts
        latest = await page.js(TEXT_JS, "gpu-latest")
        assert "STALE" in latest, latest
        assert "present" not in latest, latest
        states = await page.js(
            "return [...document.querySelectorAll('#node-gpus tr.gpu-row')]"
            ".map(r => r.children[1].textContent)"
        )
        assert states == ["stale"] * scene.GPUS

        uuid = scene.uuid(scene.HOT, 3)
        await page.js(TYPE_JS, uuid[:20])
        await page.until("the GPU found by UUID", lambda: page.js(TITLE_JS, f"{scene.HOT} / GPU 3"))
        rows = await page.js("return document.querySelectorAll('#node-gpus tr.gpu-row').length")
        assert rows == scene.GPUS, "every GPU of the node"
        assert await page.js("return document.querySelector('#node-gpus tr.picked').dataset.gpu") == "3"
        anomaly = await page.js(TEXT_JS, "gpu-anomaly")
        assert "anomaly_score: no score" in anomaly, anomaly
        assert "0.000" not in anomaly, anomaly
        # charts reach back over an hour, with round axes
        span = await page.until("the charts", lambda: page.js("return window.healerUi.state.chartSpan"))
        assert span >= 3600, span
        assert "last 6" in await page.js("return document.querySelector('.charts .range').textContent")
        link = await page.js("return document.querySelector('#node-links a')?.href")
        assert link.startswith("http://grafana.invalid/d/healer-overview?var-node=gpu-a01")

        await page.js(TYPE_JS, scene.CORDONED)
        await page.until("the cordoned node's view", lambda: page.js(TITLE_JS, scene.CORDONED))
        facts = await page.until("its facts", lambda: page.js(TEXT_JS, "node-facts"))
        assert "cordoned" in facts
        assert "driver 550.54.15" in facts
        assert "VBIOS 96.00.89.00.01" in facts
        xids = await page.js(TEXT_JS, "node-xids")
        assert "xid 79 gpu5" in xids, xids
        assert "xid 31 gpu2" in xids, xids
        history = await page.js(TEXT_JS, "node-history")
        assert "xid-fatal" in history
        assert "nvlink-crc" in history
        assert "resolved" in history
        await shoot(driver, tmp_path, "ui-node.png")

        await page.js(TYPE_JS, scene.NEVER)
        await page.until("the silent node's view", lambda: page.js(
            "return document.getElementById('node-facts').textContent.includes('no frame received yet')"
        ))  # fmt: skip
        assert "node-silent" in await page.js(TEXT_JS, "node-history")

        logs = await asyncio.to_thread(driver.get_log, "browser")
        assert [e for e in logs if e["level"] in ("SEVERE", "WARNING")] == []
        origins = await page.js(
            "return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)"
        )
        assert set(origins) <= {running.url.rstrip("/")}, origins
    finally:
        await asyncio.to_thread(driver.quit)
