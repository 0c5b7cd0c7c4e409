"""Screenshots of the status page during `healer demo` (the README's, docs/img/ui.png and ui-gpu.png).

Runs the demo in this process (its own nats-server, controller and 32-node simulated fleet), opens the
page in Debian's headless chromium (selenium + chromium-driver, no network) and saves the page at
``--at`` seconds (default 150: the mass fault has tripped the breaker), then again with one GPU's chart
open (``--gpu NODE/INDEX``, default the overheated GPU of the story): the per-node view below the map.

    .venv/bin/python benchmarks/ui_screenshot.py [--at 150] [--out docs/img] [--gpu sim-00003/5]
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import shutil
import tempfile
import time
from typing import Any

from healer import logs
from healer.demo import session

FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1500,1400", "--hide-scrollbars",
)  # fmt: skip


async def shoot(args: argparse.Namespace) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    urls: list[str] = []
    stop = asyncio.Event()
    opts = session.Options(duration_s=args.at + 60)
    demo = asyncio.create_task(
        session.run(
            opts, stop=stop, say=lambda line: urls.extend(line.split()[-1:] if "status page" in line else [])
        )
    )
    started = time.monotonic()
    out = pathlib.Path(args.out)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="healer-ui-shot-"))
    try:
        while not urls:
            if demo.done():
                demo.result()
            await asyncio.sleep(0.2)
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium") or "chromium"
        for flag in (*FLAGS, f"--user-data-dir={tmp / 'profile'}"):
            options.add_argument(flag)
        driver = await asyncio.to_thread(
            webdriver.Chrome, service=Service(shutil.which("chromedriver") or "chromedriver"), options=options
        )

        async def js(script: str, *a: Any) -> Any:
            return await asyncio.to_thread(driver.execute_script, script, *a)

        try:
            await asyncio.to_thread(driver.get, urls[0])
            await asyncio.sleep(max(0.0, args.at - (time.monotonic() - started)))
            await js("document.querySelector('#incidents li')?.click()")
            await asyncio.sleep(0.5)
            await asyncio.to_thread(driver.save_screenshot, str(out / "ui.png"))
            node, gpu = args.gpu.split("/")
            centre = await js("return window.healerUi.cellCentre(arguments[0], arguments[1])", node, int(gpu))
            await js(
                "const c = document.getElementById('map'), r = c.getBoundingClientRect();"
                "c.dispatchEvent(new MouseEvent('click', {clientX: r.left + arguments[0],"
                " clientY: r.top + arguments[1], bubbles: true}))",
                centre[0],
                centre[1],
            )
            await asyncio.sleep(1.5)
            await asyncio.to_thread(driver.save_screenshot, str(out / "ui-gpu.png"))
            logs_ = await asyncio.to_thread(driver.get_log, "browser")
            print(f"saved {out / 'ui.png'} and {out / 'ui-gpu.png'}; browser console: {len(logs_)} messages")
        finally:
            await asyncio.to_thread(driver.quit)
    finally:
        stop.set()
        await demo
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--at", type=float, default=150.0)
    p.add_argument("--out", default="docs/img")
    p.add_argument("--gpu", default="sim-00003/5")
    args = p.parse_args()
    pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
    logs.configure("error")
    asyncio.run(shoot(args))


if __name__ == "__main__":
    main()
