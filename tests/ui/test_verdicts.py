"""Operators' verdicts from the status page (#42, item 2): ``POST /api/verdict`` only behind the page's
token, bad requests refused in one line and counted, and on a real nats-server the same verdict event as
``healer incidents verdict``: archived by ``healer archive`` and pushed back to every open page."""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from healer import config, errors
from healer.archive import consumer, store
from healer.bus import embedded, subjects
from healer.bus import nats as natsbus
from healer.schemas import verdicts
from healer.ui import board, fleet, live, server, verdict_api
from tests import conftest
from tests.archive import test_consumer
from tests.feed import helpers
from tests.ui import conftest as ui_conftest
from tests.ui.test_server import Stream

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Recorder:
    """Stands in for the bus (the end-to-end test below publishes for real): keeps what it was given."""

    def __init__(self, fail: bool = False) -> None:
        self.published: list[verdicts.VerdictData] = []
        self.fail = fail

    async def __call__(self, data: verdicts.VerdictData) -> verdicts.VerdictEvent:
        if self.fail:
            raise errors.TemporaryError("no NATS")
        self.published.append(data)
        return verdicts.build(cluster="c", data=data, ts=time.time(), event_id=f"v-{len(self.published)}")


async def serve(recorder: Recorder | None, **ui: Any) -> server.Running:
    lv = live.Live(fleet.Fleet(2), board.Board())
    return await server.serve(lv, config.UiSettings(port=0, **ui), verdicts=recorder)


async def test_without_a_token_the_page_takes_no_verdict_and_says_why() -> None:
    recorder = Recorder()
    running = await serve(recorder)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(running.url + "api/verdicts") as r:
                assert await r.json() == {"enabled": False, "why": verdict_api.NO_TOKEN}
            body = {"incident_id": "inc-1", "verdict": "confirmed"}
            async with http.post(running.url + "api/verdict", json=body) as r:
                assert r.status == 403
                assert await r.text() == f"healer ui: {verdict_api.NO_TOKEN}\n"
            async with http.post(running.url + "api/snapshot", json=body) as r:
                assert r.status == 405, "no other route takes a POST"
    finally:
        await running.stop()
    assert recorder.published == []
    assert running.live.stats["verdicts_refused"] == 1


async def test_with_the_token_a_verdict_is_published_and_bad_requests_are_refused_in_one_line() -> None:
    recorder = Recorder()
    running = await serve(recorder, token=TOKEN)
    url = running.url + "api/verdict"
    try:
        async with aiohttp.ClientSession() as http:
            good = {
                "incident_id": "inc-20261207-ab12",
                "verdict": "false-alarm",
                "by": "ana",
                "note": "sensor",
            }
            async with http.post(url, json=good) as r:
                assert r.status == 401, "the token is needed as for every route"
            async with http.get(running.url + "api/verdicts", headers=AUTH) as r:
                assert await r.json() == {"enabled": True, "why": None}
            refused: list[tuple[dict[str, Any], int, str]] = [
                ({"data": b"incident_id=inc-1&verdict=confirmed"}, 415, "the body must be application/json"),
                (
                    {"data": b"{", "headers": {"Content-Type": "application/json"}},
                    400,
                    "the body is not JSON",
                ),
                ({"json": ["inc-1"]}, 400, "the body is not a JSON object"),
                ({"json": {"verdict": "confirmed"}}, 400, "incident_id is missing"),
                (
                    {"json": {"incident_id": "a b", "verdict": "confirmed"}},
                    400,
                    "'a b' is not an incident id",
                ),
                ({"json": {"incident_id": "inc-1", "verdict": "maybe"}}, 400, "verdict: "),
                (
                    {"json": {"incident_id": "inc-1", "verdict": "confirmed", "x": 1}},
                    400,
                    "unknown field(s): x",
                ),
                (
                    {"json": {"incident_id": "inc-1", "verdict": "confirmed", "note": "n" * 9000}},
                    413,
                    "the body is over",
                ),
            ]
            for kwargs, status, why in refused:
                headers = {**AUTH, **kwargs.pop("headers", {})}
                async with http.post(url, headers=headers, **kwargs) as r:
                    text = await r.text()
                    assert (r.status, text.startswith(f"healer ui: {why}")) == (status, True), (kwargs, text)
                    assert text.count("\n") == 1
            assert recorder.published == []
            assert running.live.stats["verdicts_refused"] == len(refused)
            async with http.post(url, json=good, headers=AUTH) as r:
                assert r.status == 200
                assert await r.json() == {
                    "id": "v-1", "incident_id": good["incident_id"], "verdict": "false-alarm", "by": "ana"
                }  # fmt: skip
            async with http.post(
                url, json={"incident_id": "inc-2", "verdict": "confirmed"}, headers=AUTH
            ) as r:
                assert (await r.json())["by"] == verdict_api.DEFAULT_BY
    finally:
        await running.stop()
    assert [(d.incident_id, d.verdict, d.by, d.note) for d in recorder.published] == [
        ("inc-20261207-ab12", verdicts.Verdict.FALSE_ALARM, "ana", "sensor"),
        ("inc-2", verdicts.Verdict.CONFIRMED, verdict_api.DEFAULT_BY, ""),
    ]


async def test_a_bus_that_cannot_publish_is_a_503() -> None:
    running = await serve(Recorder(fail=True), token=TOKEN)
    try:
        async with aiohttp.ClientSession() as http:
            body = {"incident_id": "inc-1", "verdict": "confirmed"}
            async with http.post(running.url + "api/verdict", json=body, headers=AUTH) as r:
                assert r.status == 503
                assert "not published" in await r.text()
    finally:
        await running.stop()


@pytest.fixture
async def page(nats_server: embedded.EmbeddedServer) -> AsyncIterator[server.Running]:
    ui = config.UiSettings(port=0, push_s=0.2, feed_window_s=60, token=TOKEN)
    async with ui_conftest.serving(nats_server.url, ui) as running:
        yield running


@pytest.mark.nats
async def test_a_verdict_from_the_page_is_the_clis_event_archived_and_pushed_to_every_page(
    page: server.Running, nats_bus: natsbus.NatsBus, tmp_path: pathlib.Path
) -> None:
    opened = helpers.event(7)  # inc-7 on gpu-node-1, so the page knows the incident
    await helpers.publish(nats_bus, opened)
    async with aiohttp.ClientSession() as http, http.get(page.url + "api/events", headers=AUTH) as r:
        stream = Stream(r)
        await stream.next("snapshot")
        body = {"incident_id": "inc-7", "verdict": "confirmed", "by": "ana", "note": "DBE confirmed by diag"}
        async with http.post(page.url + "api/verdict", json=body, headers=AUTH) as posted:
            assert posted.status == 200
            event_id = (await posted.json())["id"]
        pushed = await stream.next("verdict", timeout=10)
        assert (pushed["incident"], pushed["verdict"], pushed["by"]) == ("inc-7", "confirmed", "ana")
        async with http.get(page.url + "api/node", params={"node": "gpu-node-1"}, headers=AUTH) as n:
            [entry] = (await n.json())["incidents"]
        assert entry["verdict"]["verdict"] == "confirmed"
    db = store.Archive(tmp_path / "archive.db")
    archiver = consumer.Archiver(nats_bus, helpers.SUBJ, db, test_consumer.FAST)
    stop = asyncio.Event()
    task = asyncio.create_task(archiver.run(stop))
    try:
        await conftest.until(lambda: archiver.counts.stored == 2)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    rows = list(db.rows("SELECT id, incident_id, verdict, by, note FROM verdicts"))
    db.close()
    assert [tuple(r) for r in rows] == [(event_id, "inc-7", "confirmed", "ana", "DBE confirmed by diag")]
    subject_of = subjects.Subjects().verdict("inc-7")
    assert subject_of == "healer.incidents.verdict.inc-7"  # where `healer incidents verdict` publishes
