"""What the page's server knows for the per-node view and the map's first paint (issue #23): an hour of
downsampled history, nodes on the map before their first frame, node marks from the action catalogue,
versions from a validation, search; and, against a real nats-server, the admitted inventory on the first
snapshot, XIDs from the events stream, and feed events of types the page does not know."""

from __future__ import annotations

import asyncio
import json
import pathlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest

from healer import config
from healer.bus import embedded, subjects
from healer.bus import nats as natsbus
from healer.schemas import codec, events, incidents
from healer.ui import board, fleet, live, server
from tests.ui import scene
from tests.ui.test_server import Stream


def test_history_keeps_bucket_means_over_an_hour_older_than_the_ring() -> None:
    f = fleet.Fleet(8, ring_len=90, history_len=125, history_step_s=30.0)
    now = 1_800_000_000.0
    t = now - 2 * 3600
    while t <= now:  # one frame a second for two hours, the temperature a ramp
        f.ingest("gpu-a01", scene.frame("gpu-a01", t - now, t), t)
        t += 1.0
    s = f.series("gpu-a01", 0)
    assert s is not None
    ts = s["ts"]
    assert isinstance(ts, list)
    assert now - ts[0] >= 3600, "an hour back, at least"
    assert len(ts) <= 125 + 90, "downsampled: bucket means, not every frame"
    points = s["history_points"]
    assert isinstance(points, int)
    assert 120 <= points <= 125  # the newest buckets are the ring's, shown once
    assert ts == sorted(ts)
    # a bucket is the mean of its 30 frames: the history point at its middle equals the readings' mean there
    mid = ts[0]
    readings = [scene.frame("gpu-a01", mid - 15 + k - now, 1.0).gpus[0].temp_c for k in range(30)]
    expected = sum(r or 0.0 for r in readings) / 30
    assert s["series"]["temp_c"][0] == pytest.approx(expected, abs=0.1)  # type: ignore[index]


def test_nodes_declared_before_their_first_frame_are_drawn_silent_and_bounded() -> None:
    lv = live.Live(fleet.Fleet(2, max_nodes=3), board.Board(), admitted=lambda: ["a", "b", "c", "d"])
    snap = lv.snapshot(now=100.0)
    assert snap["nodes"] == ["a", "b", "c"]
    assert lv.fleet.refused == 1  # past max_nodes: counted, not grown
    assert set(lv.health(100.0).ravel().tolist()) == {live.HEALTH_NODE_SILENT}


def test_an_incidents_node_is_on_the_map_but_the_fleet_wide_breaker_is_not() -> None:
    lv = live.Live(fleet.Fleet(2), board.Board())
    lv.board.apply(scene.event("i1", "gone", None, "node-silent", "major", "opened", 10.0, "silent"))
    lv.board.apply(
        scene.event("i2", board.FLEET_NODE, None, "circuit-breaker", "critical", "escalated", 10.0, "open")
    )
    assert lv.snapshot(now=20.0)["nodes"] == ["gone"]


@pytest.mark.parametrize(
    ("kinds", "mark"),
    [
        (["cordon"], "cordoned"),
        (["inspect"], "cordoned"),
        (["drain"], "drained"),
        (["cordon", "migrate"], "drained"),
        (["cordon", "uncordon"], None),
        (["reboot_node", "return_to_service"], None),
        (["notify", "power_limit"], None),
    ],
)
def test_node_marks_follow_the_last_completed_scheduler_action(kinds: list[str], mark: str | None) -> None:
    acts = [scene.done(k, float(i)) for i, k in enumerate(kinds)]
    assert board.node_mark(acts) == mark


def test_planned_and_dry_run_actions_mark_nothing_and_exclusions_are_marked() -> None:
    b = board.Board()
    planned = incidents.ActionRecord(kind="cordon", status="planned", detail="", at=1.0)
    b.apply(scene.event("p", "n1", None, "xid-fatal", "critical", "action", 1.0, "x", actions=[planned]))
    b.apply(scene.event("d", "n2", None, "xid-fatal", "critical", "action", 1.0, "x",
                        actions=[scene.done("cordon", 1.0)], mode="dry-run"))  # fmt: skip
    b.apply(scene.event("e", "n3", None, "xid-fatal", "critical", "action", 1.0, "x",
                        actions=[scene.done("cordon", 1.0)]))  # fmt: skip
    b.set_exclusion("n4", {"by": "ops", "reason": "r"})
    assert b.node_marks() == {"n3": ["cordoned"], "n4": ["excluded"]}
    b.apply(scene.event("e", "n3", None, "xid-fatal", "critical", "resolved", 2.0, "x",
                        actions=[scene.done("cordon", 1.0), scene.done("uncordon", 2.0)], seq=2))  # fmt: skip
    assert b.node_marks() == {"n4": ["excluded"]}
    assert [h["resolved"] for h in b.node_history("n3")] == [2.0]


def test_a_marks_change_alone_reaches_the_browsers() -> None:
    lv = live.Live(fleet.Fleet(2), board.Board())
    lv.fleet.declare(["n1"])
    lv.snapshot(now=1.0, rebase=True)
    assert lv.cells(now=1.0) is None
    lv.board.set_exclusion("n1", {"by": "ops"})
    out = lv.cells(now=1.0)
    assert out is not None
    assert out[0] == "cells"
    assert out[1]["marks"] == {"n1": ["excluded"]}


def test_versions_come_from_evidence_and_facts_flat_or_not() -> None:
    assert board.versions({"driver_version": "550.54", "validate.vbios_version": "96.00", "x": 1}) == {
        "driver": "550.54",
        "vbios": "96.00",
    }
    assert board.versions({"driver_version": None}) == {}


def test_search_finds_nodes_gpus_and_uuids() -> None:
    lv, _ = scene.build(time.time())
    f = lv.fleet
    assert f.find("gpu-a0")[0]["node"] == "gpu-a01"
    assert f.find("GPU-A01/3") == [{"node": "gpu-a01", "gpu": 3, "uuid": scene.uuid("gpu-a01", 3)}]
    assert f.find(scene.uuid("gpu-b01", 6)[:23].lower()) == [
        {"node": "gpu-b01", "gpu": 6, "uuid": scene.uuid("gpu-b01", 6)}
    ]
    assert f.find("") == []
    assert f.find("nothing-like-it") == []


async def test_the_node_endpoint_lists_every_gpu_stale_flags_history_versions_and_links() -> None:
    lv, ui = scene.build(time.time())
    running = await server.serve(lv, ui)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{running.url}api/node", params={"node": scene.STALE}) as r:
                stale = await r.json()
            async with http.get(f"{running.url}api/node", params={"node": scene.CORDONED}) as r:
                cordoned = await r.json()
            async with http.get(f"{running.url}api/gpu", params={"node": scene.STALE, "gpu": "0"}) as r:
                gpu = await r.json()
            async with http.get(f"{running.url}api/search", params={"q": "gpu-c"}) as r:
                found = await r.json()
            async with http.get(f"{running.url}api/node", params={"node": "nope"}) as r:
                assert r.status == 404
    finally:
        await running.stop()
    assert stale["stale"] is True
    assert 31 * 60 <= stale["age_s"] < 32 * 60
    assert [g["state"] for g in stale["gpus"]] == ["stale"] * scene.GPUS
    assert gpu["stale"] is True  # the GPU's own readings, labelled stale too
    assert cordoned["marks"] == ["cordoned"]
    assert (cordoned["driver"], cordoned["vbios"]) == ("550.54.15", "96.00.89.00.01")
    assert [x["xid"] for x in cordoned["xids"]] == [79, 31]
    assert {h["rule"] for h in cordoned["incidents"]} == {"xid-fatal", "nvlink-crc"}
    assert cordoned["grafana"] == "http://grafana.invalid/d/healer-overview?var-node=gpu-a02&var-gpu="
    assert cordoned["gpus"][5]["severity"] == "critical"
    assert cordoned["gpus"][5]["grafana"].endswith("var-node=gpu-a02&var-gpu=5")
    assert stale["versions_note"] == server.NO_VERSIONS
    nodes = [h["node"] for h in found if h["gpu"] is None]
    assert nodes == ["gpu-c01", "gpu-c02", "gpu-c03", "gpu-c04"]  # nodes first, then GPUs by UUID


def test_a_grafana_url_must_be_http() -> None:
    with pytest.raises(ValueError, match="not an http"):
        config.UiSettings(grafana_url="grafana.example/d/x")
    assert (
        server.grafana_link("https://g/d?var-node={node}&var-gpu={gpu}", "a b", 2)
        == "https://g/d?var-node=a%20b&var-gpu=2"
    )
    assert server.grafana_link(None, "a") is None


@pytest.fixture
async def page_on_nats(
    nats_server: embedded.EmbeddedServer, nats_bus: natsbus.NatsBus, tmp_path: pathlib.Path
) -> AsyncIterator[dict[str, Any]]:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(json.dumps({"nodes": ["inv-1", "inv-2"]}))
    settings = config.Settings(
        nats=config.NatsSettings(url=nats_server.url),
        controller=config.ControllerSettings.model_validate(
            {"admission": "file", "inventory_file": str(inventory)}
        ),
        ui=config.UiSettings(port=0, push_s=0.2, feed_window_s=600),
    )
    subj = subjects.Subjects()
    xid = events.new("inv-1", "xid", gpu_index=2, xid=79, message="NVRM: Xid 79", ts=time.time() - 30)
    await nats_bus.publish_durable(subj.events("inv-1"), codec.encode(xid), xid.id)
    ui_bus = await natsbus.NatsBus.connect(nats_server.url, name="ui")
    running = await server.start(ui_bus, settings)
    try:
        yield {"ui": running, "subj": subj}
    finally:
        await running.stop()
        await ui_bus.close()


@pytest.mark.nats
async def test_on_nats_the_inventory_is_on_the_first_snapshot_and_xids_come_from_the_events_stream(
    page_on_nats: dict[str, Any], nats_bus: natsbus.NatsBus
) -> None:
    running: server.Running = page_on_nats["ui"]
    subj: subjects.Subjects = page_on_nats["subj"]
    async with aiohttp.ClientSession() as http:
        async with http.get(running.url + "api/events") as r:
            snap = await Stream(r).next("snapshot")
        assert snap["nodes"] == ["inv-1", "inv-2"]  # before any frame
        async with asyncio.timeout(10):
            while True:
                async with http.get(running.url + "api/node", params={"node": "inv-1"}) as r:
                    view = await r.json()
                if view["xids"]:
                    break
                await asyncio.sleep(0.1)
        assert [(x["xid"], x["gpu"]) for x in view["xids"]] == [(79, 2)]
        # a CloudEvent of a type this page does not know: a feed line, not dropped
        other = {
            "specversion": "1.0", "id": "o-1", "source": "healer://default/controller",
            "type": "io.healer.rules.rejected.v2", "subject": "/etc/healer/rules",
            "time": datetime.now(tz=UTC).isoformat(), "data": {"anything": 1},
        }  # fmt: skip
        await nats_bus.publish_durable(subj.rules_rejected, json.dumps(other).encode(), "o-1")
        async with http.get(running.url + "api/events") as r:
            stream = Stream(r)
            snap = await stream.next("snapshot")
            while not any(line["id"] == "o-1" for line in snap["recent"]):
                await stream.next("feed")
                async with http.get(running.url + "api/snapshot") as r2:
                    snap = await r2.json()
        line = next(line for line in snap["recent"] if line["id"] == "o-1")
        assert line["severity"] == "major"
        assert snap["safety"]["rules_rejected"]["dir"] == "/etc/healer/rules"
