"""A shared-cause domain incident on the status page (#27), in headless chromium: a real controller on a
real nats-server opens one for a leaf switch whose three nodes lose their GPUs together; the page, fed by
the real incident feed, draws a dashed outline over exactly those nodes' tiles, names the suspected
switch in the domain's group header and lists the members in the incident; when the domain recovers,
the outline goes."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from healer import config, testing
from healer.bus import embedded
from healer.bus import nats as natsbus
from healer.ui import server
from tests.controller import conftest as ctl
from tests.controller.test_shared_cause import XID_RESET, Firing
from tests.ui import conftest as ui_conftest
from tests.ui.test_browser import Page

pytestmark = [pytest.mark.browser, pytest.mark.nats, pytest.mark.slow]

LEAF1 = ["gpu-a01", "gpu-a02", "gpu-a03"]
LEAF2 = ["gpu-b01", "gpu-b02"]
BOXES_JS = "return window.healerUi.domainBoxes()"
MEMBERS_JS = """const li = document.querySelector('#incidents li.domain');
return li && [...li.querySelectorAll('.members .node-link')].map(b => b.textContent)"""


@pytest.fixture
async def stack(
    nats_server: embedded.EmbeddedServer, tmp_path: pathlib.Path
) -> AsyncIterator[dict[str, Any]]:
    h = ctl.Harness(nats_server, tmp_path)
    await h.setup()
    (h.rules / "xid.yaml").write_text(XID_RESET)
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text(
        "nodes:\n"
        + "".join(f"  {n}: {{switch: leaf-01}}\n" for n in LEAF1)
        + "".join(f"  {n}: {{switch: leaf-02}}\n" for n in LEAF2)
    )
    cs = {
        "gpus_per_node": 2, "admission": "file", "inventory_file": str(inventory), "breaker_max_percent": 100,
        "shared_cause_min_nodes": 3, "shared_cause_window_s": 60,
    }  # fmt: skip
    await h.controller(testing.RecordingActuator(), **cs)
    fleet = ctl.Fleet(h.bus, [*LEAF1, *LEAF2])
    await ctl.warm(fleet)
    settings = h.settings(**cs).model_copy(
        update={"ui": config.UiSettings(port=0, push_s=0.3, group_by=("switch",))}
    )
    ui_bus = await natsbus.NatsBus.connect(nats_server.url, name="ui")
    running = await server.start(ui_bus, settings)

    async def agents() -> None:
        while True:
            await fleet.publish()
            await asyncio.sleep(0.2)

    publisher = asyncio.create_task(agents())
    firing = Firing(h)
    try:
        yield {"harness": h, "ui": running, "firing": firing}
    finally:
        await firing.recover()
        publisher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await publisher
        await running.stop()
        await ui_bus.close()
        await h.close()


async def test_a_domain_incident_is_drawn_over_its_member_nodes(
    stack: dict[str, Any], tmp_path: pathlib.Path
) -> None:
    driver = await asyncio.to_thread(ui_conftest.start_chromium, tmp_path)
    try:
        page = Page(driver)
        await asyncio.to_thread(driver.get, stack["ui"].url)
        await page.until(
            "the snapshot", lambda: page.js("return !!(window.healerUi && window.healerUi.state.ready)")
        )
        groups = await page.js("return window.healerUi.state.groups.map(g => g[0])")
        assert groups == ["switch=leaf-01", "switch=leaf-02"], "grouped by the inventory's switches"
        assert await page.js(BOXES_JS) == []

        firing: Firing = stack["firing"]
        for node in LEAF1:
            await firing.add(node)
        boxes = await page.until("the domain outline", lambda: page.js(BOXES_JS), timeout=20)
        (box,) = boxes
        assert box["block"] == "switch=leaf-01"
        assert sorted(box["nodes"]) == LEAF1, "drawn over exactly the member nodes"
        colour = await page.js("return window.healerUi.domainColour")
        top = [
            await page.js(
                "return window.healerUi.pixelAt(arguments[0], arguments[1])", box["x"] + dx, box["y"]
            )
            for dx in range(2, int(box["w"]) - 2, 2)
        ]
        assert top.count(colour) >= len(top) // 3, "the dashed outline is on the canvas"
        inside = await page.js("return window.healerUi.framePixel(arguments[0])", LEAF2[0])
        assert inside != colour, "the other switch's nodes are not outlined"
        members = await page.until("the members in the incident", lambda: page.js(MEMBERS_JS))
        assert members == LEAF1
        text = await page.js("return document.querySelector('#incidents li.domain').textContent")
        assert "switch leaf-01" in text
        assert "3 of 3 nodes" in text
        shown = await page.js("return window.healerUi.state.nodes")
        assert "switch.leaf-01" not in shown, "the domain incident is drawn over its members, not as a node"
        legend = await page.js("return document.getElementById('legend').textContent")
        assert "suspected domain" in legend
        shot = tmp_path / "healer-ui-domain.png"
        await asyncio.to_thread(driver.save_screenshot, str(shot))
        assert shot.stat().st_size > 10_000

        await firing.recover()  # the switch is back: the domain incident resolves, the outline goes
        await page.until(
            "the outline gone",
            lambda: page.js("return window.healerUi.domainBoxes().length === 0"),
            timeout=30,
        )
        logs = await asyncio.to_thread(driver.get_log, "browser")
        assert [e for e in logs if e["level"] in ("SEVERE", "WARNING")] == []
    finally:
        await asyncio.to_thread(driver.quit)
