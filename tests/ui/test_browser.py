"""The status page in a real browser (headless chromium) against a real nats-server, a controller running
in-process with a RecordingActuator, and a small simulated fleet publishing frames as agents do."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import yaml

from healer import config, testing
from healer.bus import embedded, subjects
from healer.bus import nats as natsbus
from healer.controller.core import power_views
from healer.controller.power import power_budget
from healer.controller.store import kv
from healer.ui import server
from tests.controller import conftest as ctl
from tests.ui import conftest as ui_conftest

pytestmark = [pytest.mark.browser, pytest.mark.nats, pytest.mark.slow]

NODES = ["gpu-a01", "gpu-a02", "gpu-b01", "gpu-b02"]
LABELS = {
    "gpu-a01": {"rack": "r1"},
    "gpu-a02": {"rack": "r1"},
    "gpu-b01": {"rack": "r2"},
    "gpu-b02": {"rack": "r2"},
}
OK, CRITICAL = "#2e9e5b", "#e03c3c"
ROWS_JS = """return document.querySelectorAll(
    `#incidents li[data-node='${arguments[0]}'][data-gpu='${arguments[1]}']`).length"""
CLICK_JS = """const c = document.getElementById('map'), r = c.getBoundingClientRect();
c.dispatchEvent(new MouseEvent('click', {clientX: r.left + arguments[0], clientY: r.top + arguments[1],
                                         bubbles: true}))"""
PANEL_JS = """const p = document.getElementById('gpu-panel');
return !p.hidden && document.getElementById('gpu-title').textContent"""
INK_JS = """const c = document.getElementById('chart-temp'), p = document.createElement('canvas');
p.width = c.width; p.height = c.height; const x = p.getContext('2d', {willReadFrequently: true});
x.drawImage(c, 0, 0); const d = x.getImageData(0, 0, c.width, c.height).data;
let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n"""
MODE_JS = """const m = document.getElementById('mode'); m.value = arguments[0];
m.dispatchEvent(new Event('change'))"""
ORIGINS_JS = "return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)"


class Page:
    """Selenium calls, each in a thread so that the event loop keeps serving the page meanwhile."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    async def js(self, script: str, *args: Any) -> Any:
        return await asyncio.to_thread(self.driver.execute_script, script, *args)

    async def until(self, what: str, check: Callable[[], Any], timeout: float = 10.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = await check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"page: {what} did not happen within {timeout} s (last: {value!r})")
            await asyncio.sleep(0.2)

    async def pixel(self, node: str, gpu: int) -> str | None:
        color: str | None = await self.js(
            "return window.healerUi && window.healerUi.cellPixel(arguments[0], arguments[1])", node, gpu
        )
        return color

    async def incident_rows(self, node: str, gpu: int) -> int:
        return int(await self.js(ROWS_JS, node, gpu))


@pytest.fixture
async def stack(
    nats_server: embedded.EmbeddedServer, tmp_path: pathlib.Path
) -> AsyncIterator[dict[str, Any]]:
    h = ctl.Harness(nats_server, tmp_path)
    await h.setup()
    actuator = testing.RecordingActuator()
    await h.controller(actuator, gpus_per_node=2)
    fleet = ctl.Fleet(h.bus, NODES)
    await ctl.warm(fleet)
    (tmp_path / "labels.yaml").write_text(yaml.safe_dump(LABELS))
    settings = h.settings(gpus_per_node=2).model_copy(
        update={"ui": config.UiSettings(port=0, push_s=0.3, labels_file=str(tmp_path / "labels.yaml"))}
    )
    ui_bus = await natsbus.NatsBus.connect(nats_server.url, name="ui")
    running = await server.start(ui_bus, settings)

    async def agents() -> None:
        while True:
            await fleet.publish()
            await asyncio.sleep(0.2)

    publisher = asyncio.create_task(agents())
    try:
        yield {"harness": h, "fleet": fleet, "ui": running, "actuator": actuator, "tmp": tmp_path}
    finally:
        publisher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await publisher
        await running.stop()
        await ui_bus.close()
        await h.close()


async def test_fault_appears_on_map_and_in_incidents_then_clears(
    stack: dict[str, Any], tmp_path: pathlib.Path
) -> None:
    driver = await asyncio.to_thread(ui_conftest.start_chromium, tmp_path)
    try:
        page = Page(driver)
        await asyncio.to_thread(driver.get, stack["ui"].url)
        await page.until(
            "the snapshot",
            lambda: page.js(
                "return window.healerUi && window.healerUi.state.ready && window.healerUi.state.nodes.length"
            ),
        )
        await page.until("every node drawn healthy", lambda: _all(page, OK))
        groups = await page.js("return window.healerUi.state.groups.map(g => g[0])")
        assert groups == ["rack=r1", "rack=r2"]

        fleet: ctl.Fleet = stack["fleet"]
        fleet.overrides[("gpu-b01", 1)] = {"ecc_dbe_volatile": 1}
        # No duration is asserted: the wait gives up at 5 s, so a fault that reaches the page later than
        # a few of the controller's 1 s ticks (a stalled stream, a page that waits for the next snapshot)
        # fails it.

        async def listed_and_drawn() -> bool:
            return bool(await page.incident_rows("gpu-b01", 1)) and await _is(page, "gpu-b01", 1, CRITICAL)

        await page.until("the incident listed and its cell drawn critical", listed_and_drawn, timeout=5)
        assert await page.pixel("gpu-b01", 0) == OK, "only the faulty GPU is critical"
        text = await page.js("return document.querySelector('#incidents li').textContent")
        assert "ecc-dbe" in text
        assert "critical" in text
        await page.until(
            "the cordon action",
            lambda: page.js("return document.querySelector('#incidents li .chip.done') !== null"),
        )
        await page.until(
            "the feed line",
            lambda: page.js("return document.querySelector('#feed').textContent.includes('opened')"),
        )
        # the incident's timeline and evidence open with a click
        await asyncio.to_thread(driver.find_element("css selector", "#incidents li").click)
        details = await page.until(
            "details", lambda: page.js("return document.querySelector('#incidents li .details')?.textContent")
        )
        assert "ecc_dbe_volatile" in details
        assert "cordon: done" in details
        shot = tmp_path / "healer-ui.png"
        await asyncio.to_thread(driver.save_screenshot, str(shot))
        assert shot.stat().st_size > 10_000

        # a click on a GPU opens its recent readings as a chart (the click is aimed again if the map's
        # layout moved under it, as it may while the incident list grows on a loaded machine)
        async def clicked_panel() -> str | None:
            title: str | None = await page.js(PANEL_JS)
            if title and title.startswith("gpu-a02 / GPU 0"):
                return title
            centre = await page.js("return window.healerUi.cellCentre('gpu-a02', 0)")
            await page.js(CLICK_JS, centre[0], centre[1])
            return None

        await page.until("the GPU panel of gpu-a02 / GPU 0", clicked_panel)
        assert await page.js(
            "return document.getElementById('gpu-anomaly').textContent.includes('not published')"
        )
        inked = await page.js(INK_JS)
        assert inked > 200, "the temperature chart drew nothing"

        # coloured by temperature instead, the healthy cells leave the health palette
        await page.js(MODE_JS, "temp")
        assert await page.pixel("gpu-a01", 0) not in (OK, CRITICAL)
        assert "°C" in await page.js("return document.getElementById('legend').textContent")
        await page.js(MODE_JS, "health")
        assert await page.pixel("gpu-a01", 0) == OK

        fleet.overrides[("gpu-b01", 1)] = {"ecc_dbe_volatile": 0}
        await page.until(
            "the incident gone from the list", lambda: _not(page.incident_rows("gpu-b01", 1)), timeout=8
        )
        await page.until("the cell healthy again", lambda: _is(page, "gpu-b01", 1, OK), timeout=8)
        await page.until(
            "the resolved feed line",
            lambda: page.js("return document.querySelector('#feed').textContent.includes('resolved')"),
        )

        logs = await asyncio.to_thread(driver.get_log, "browser")
        assert [e for e in logs if e["level"] in ("SEVERE", "WARNING")] == []
        origins = await page.js(
            "return performance.getEntriesByType('resource').map(e => new URL(e.name).origin)"
        )
        assert set(origins) <= {stack["ui"].url.rstrip("/")}, origins
    finally:
        await asyncio.to_thread(driver.quit)


async def _all(page: Page, colour: str) -> bool:
    for node in NODES:
        for gpu in (0, 1):
            if await page.pixel(node, gpu) != colour:
                return False
    return True


async def _is(page: Page, node: str, gpu: int, colour: str) -> bool:
    return await page.pixel(node, gpu) == colour


async def _not(value: Any) -> bool:
    return not await value


async def test_a_capped_rack_and_its_shed_show_in_the_safety_panel(
    stack: dict[str, Any], tmp_path: pathlib.Path
) -> None:
    h: ctl.Harness = stack["harness"]
    store = kv.Store(await h.bus.key_value(subjects.Subjects().kv_state))
    budget = config.PowerBudget(key="rack", value="r1", contract_kw=3)
    state = power_budget.DomainState(
        capped_w={"gpu-a01/0": 400.0, "gpu-a02/1": 400.0}, shed_to_w=2500.0, shed_until=time.time() + 900
    )
    driver = await asyncio.to_thread(ui_conftest.start_chromium, tmp_path)
    try:
        page = Page(driver)
        await asyncio.to_thread(driver.get, stack["ui"].url)
        await page.until(
            "the snapshot", lambda: page.js("return window.healerUi && window.healerUi.state.ready")
        )
        assert await page.js("return document.getElementById('power').textContent") == ""
        await store.put(power_views.kv_key(budget), {**state.dump(), "domain": budget.domain})  # as the shell
        text = await page.until(
            "the power line", lambda: page.js("return document.getElementById('power').textContent")
        )
        assert "power rack=r1: 2 GPU(s) capped" in text
        assert "demand response: 2.5 kW" in text
        # the leader's live view at a step (power_views.live_of, as it writes it): the draw against the
        # budget in force, the phase
        view = power_views.DomainView(
            budget, ("gpu-a01", "gpu-a02"), 4, 2430.0, 2500.0, power_budget.Phase.CAPPED, state, "inc-9"
        )
        live = power_views.live_of(view, time.time())
        await store.put(power_views.kv_key(budget), {**state.dump(), "domain": budget.domain, "live": live})
        text = await page.until(
            "the live draw",
            lambda: page.js(
                "const t = document.getElementById('power').textContent; return t.includes(' kW of ') && t"
            ),
        )
        assert "power rack=r1: 2.4 kW of 2.5 kW in force (its budget 3.0 kW), capped" in text
        assert "2 GPU(s) capped" in text
        under = power_views.DomainView(
            budget, ("gpu-a01", "gpu-a02"), 4, 1800.0, 3000.0, power_budget.Phase.UNDER,
            power_budget.DomainState(), None,
        )  # fmt: skip
        await store.put(
            power_views.kv_key(budget),
            {
                **power_budget.DomainState().dump(),
                "domain": budget.domain,
                "live": power_views.live_of(under, 1.0),
            },
        )
        text = await page.until(
            "the restored rack's draw",
            lambda: page.js(
                "const t = document.getElementById('power').textContent; return t.includes('under') && t"
            ),
        )
        assert "power rack=r1: 1.8 kW of 3.0 kW, under" in text
        assert "capped" not in text, "nothing held down, no shed: only the live draw"
        await store.put(power_views.kv_key(budget), power_budget.DomainState().dump())  # restored
        await page.until(
            "the line gone", lambda: page.js("return document.getElementById('power').textContent === ''")
        )
    finally:
        await asyncio.to_thread(driver.quit)
