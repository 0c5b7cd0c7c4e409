"""The report's page in Debian's headless chromium: it loads nothing from anywhere, draws both plots,
and logs no error (skips without chromium, except in CI)."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from healer.archive import figures, page, store
from tests.archive import test_report as hand
from tests.ui import conftest as ui


@pytest.fixture
def browser(tmp_path: pathlib.Path) -> Iterator[Any]:
    """A fresh headless chromium (tests/ui/conftest.py's), quit afterwards."""
    driver = ui.start_chromium(tmp_path / "browser", width=1200, height=1600)
    try:
        yield driver
    finally:
        driver.quit()


def look(driver: Any, url: str, shot: pathlib.Path) -> dict[str, Any]:
    from selenium.webdriver.common.by import By

    driver.get(url)
    svgs = driver.find_elements(By.TAG_NAME, "svg")
    out = {
        "title": driver.title,
        "resources": driver.execute_script("return performance.getEntriesByType('resource').length"),
        "svg_sizes": [(s.size["width"], s.size["height"]) for s in svgs],
        "bars": [len(s.find_elements(By.TAG_NAME, "rect")) for s in svgs],
        "errors": [e for e in driver.get_log("browser") if e["level"] == "SEVERE"],
        "shot": driver.save_screenshot(str(shot)),
    }
    return out


async def test_the_page_opens_in_chromium_self_contained_with_both_plots(
    browser: Any, tmp_path: pathlib.Path
) -> None:
    path = hand.build_archive(tmp_path / "archive.db")
    with store.Archive(path, readonly=True) as db:
        report = figures.build(db, figures.Options(end=hand.END, since_s=7 * hand.DAY, fleet_gpus=100))
    html = tmp_path / "report.html"
    html.write_text(page.render(report))
    seen = await asyncio.to_thread(look, browser, html.as_uri(), tmp_path / "report.png")
    assert seen["title"] == "healer reliability report"
    assert seen["resources"] == 0  # nothing fetched: no stylesheet, script, font or image
    assert seen["errors"] == []
    assert len(seen["svg_sizes"]) == 3
    assert all(w > 300 and h > 100 for w, h in seen["svg_sizes"][:2])
    assert seen["svg_sizes"][2][0] > 200  # the map of repeat offenders: one row (n1)
    # the histogram: 2 non-empty buckets (1h-4h, 4h-1d); the days: 6 segments on 5 days; plus legends;
    # the map: n1's node cell and its 8 GPUs' (GPU 0 with its 3 incidents)
    assert seen["bars"] == [2 + 1, 6 + 3, 9]
    assert seen["shot"]
    assert (tmp_path / "report.png").read_bytes().startswith(b"\x89PNG")
