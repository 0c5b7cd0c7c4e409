"""The status page's fixtures: a page served on its own bus (``serving``), and Debian's chromium,
headless, driven by selenium through Debian's chromium-driver.

Without chromium the browser tests skip, except where ``CI`` is set: there they fail (``.ci/run``
installs it). Every selenium call blocks, so tests run them in a thread (``asyncio.to_thread``) while the
event loop keeps serving the page.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from healer import config
from healer.bus import nats as natsbus
from healer.ui import server


@contextlib.asynccontextmanager
async def serving(nats_url: str, ui: config.UiSettings) -> AsyncIterator[server.Running]:
    """The status page with ``ui``'s settings, on a bus of its own to ``nats_url``; stopped after."""
    ui_bus = await natsbus.NatsBus.connect(nats_url, name="ui")
    try:
        running = await server.start(ui_bus, config.Settings(nats=config.NatsSettings(url=nats_url), ui=ui))
        try:
            yield running
        finally:
            await running.stop()
    finally:
        await ui_bus.close()


CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1500,950",
)
"""Headless, and never reaching out (this machine has no network; without these it tries Google)."""


def chromium_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        msg = "needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return chromium, driver


def start_chromium(tmp: pathlib.Path, width: int = 1500, height: int = 950) -> Any:
    chromium, driver_path = chromium_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--window-size={width},{height}")
    profile = tmp / "chromium-profile"
    profile.mkdir(parents=True, exist_ok=True)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=driver_path, log_output=str(tmp / "chromedriver.log"))
    return webdriver.Chrome(service=service, options=options)


@pytest.fixture
def browser(tmp_path: pathlib.Path) -> Iterator[Any]:
    """A fresh headless chromium with its own profile; quit (chromedriver and chromium) afterwards."""
    driver = start_chromium(tmp_path)
    try:
        yield driver
    finally:
        driver.quit()
