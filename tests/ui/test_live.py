"""The page's state without a browser or NATS: the map's cells, what changes are sent, incidents."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

import numpy as np

from healer.schemas import incidents, telemetry
from healer.sim import node_source
from healer.ui import board, fleet, live

NOW = 1_796_000_000.0


def frame(node: str, temps: list[float | None], expected: int | None = None) -> telemetry.NodeFrame:
    gpus = [
        g.model_copy(update={"temp_c": t})
        for g, t in zip(
            node_source.SimSource(node, gpus=len(temps), seed=1).sample().gpus, temps, strict=True
        )
        if t is not None
    ]
    return telemetry.NodeFrame(
        node=node, ts=NOW, seq=1, boot_id="b", agent_version="t", source="sim",
        gpus_expected=expected if expected is not None else len(temps), gpus=gpus,
    )  # fmt: skip


def event(change: str, node: str, gpu: int | None, state: str = "open", iid: str = "inc-1", **kw: Any) -> Any:
    data = incidents.IncidentData(
        incident_id=iid, rule_id="ecc-dbe", severity=kw.get("severity", "critical"), node=node,
        gpu_index=gpu, state=state, summary="s", evidence={"x": 1}, labels=kw.get("labels", {}),
        mode="enforce",
    )  # fmt: skip
    return incidents.IncidentEvent(
        id=f"{iid}.{change}", source="healer://t/controller", type=incidents.event_type(change),  # type: ignore[arg-type]
        subject="node/x", time=datetime.fromtimestamp(kw.get("at", NOW), tz=UTC), data=data,
    )  # fmt: skip


def make(nodes: int = 3, gpus: int = 2) -> live.Live:
    lv = live.Live(fleet.Fleet(gpus, ring_len=4, capacity=1), board.Board(), stale_after_s=30)
    for i in range(nodes):
        lv.fleet.ingest(f"n{i}", frame(f"n{i}", [60.0] * gpus), NOW)
    return lv


def cells(snap: dict[str, Any], key: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(snap[key]), np.uint8)


def test_snapshot_carries_every_cell_as_compact_bytes_in_node_order() -> None:
    lv = make(nodes=3)
    snap = lv.snapshot(NOW)
    assert snap["nodes"] == ["n0", "n1", "n2"]
    assert cells(snap, "temp").tolist() == [60] * 6
    assert cells(snap, "health").tolist() == [0] * 6
    assert snap["groups"] == [["fleet", [0, 1, 2]]]


def test_only_cells_that_moved_past_the_deadband_or_changed_health_are_sent() -> None:
    lv = make(nodes=2)
    lv.snapshot(NOW, rebase=True)
    assert lv.cells(NOW) is None
    lv.fleet.ingest("n0", frame("n0", [61.0, 63.0]), NOW)  # +1: below the 2 C deadband; +3: sent
    out = lv.cells(NOW)
    assert out is not None
    kind, msg = out
    assert kind == "cells"
    assert (msg["i"], msg["t"]) == ([1], [63])
    lv.board.apply(event("opened", "n1", 0))
    out = lv.cells(NOW)
    assert out is not None
    _, msg = out
    assert (msg["i"], msg["h"]) == ([2], [4])


def test_a_missing_gpu_a_silent_node_and_a_node_incident_have_their_own_codes() -> None:
    lv = make(nodes=3)
    lv.fleet.ingest("n0", frame("n0", [60.0, None]), NOW)  # GPU 1 fell off the bus
    lv.board.apply(event("opened", "n1", None, severity="major"))
    lv.fleet.seen_at[2] = NOW - 31
    h = lv.health(NOW)
    assert h.tolist() == [[0, live.HEALTH_GPU_MISSING], [3, 3], [live.HEALTH_NODE_SILENT] * 2]


def test_a_new_node_or_a_new_rack_label_sends_a_fresh_snapshot() -> None:
    lv = make(nodes=1)
    lv.snapshot(NOW, rebase=True)
    lv.fleet.ingest("n9", frame("n9", [50.0, 50.0]), NOW)
    out = lv.cells(NOW)
    assert out is not None
    kind, snap = out
    assert kind == "snapshot"
    assert snap["nodes"] == ["n0", "n9"]
    lv.board.apply(event("opened", "n9", 0, labels={"rack": "r7"}))
    out = lv.cells(NOW)
    assert out is not None
    kind, snap = out
    assert kind == "snapshot"
    assert snap["groups"] == [["rack=r7", [1]], ["unlabelled", [0]]]


def test_resolved_incidents_leave_the_open_list_and_a_late_kv_seed_cannot_revive_them() -> None:
    b = board.Board()
    b.apply(event("opened", "n0", 1))
    b.apply(event("action", "n0", 1))
    assert [s["change"] for s in b.open["inc-1"].as_json()["timeline"]] == ["opened", "action"]
    b.apply(event("resolved", "n0", 1, state="resolved"))
    assert b.open == {}
    doc = {"id": "inc-1", "rule_id": "r", "severity": "major", "node": "n0", "mode": "enforce"}
    assert not b.seed(doc)
    assert b.seed(
        {**doc, "id": "inc-2", "opened_at": NOW, "actions": [{"kind": "cordon", "status": "done", "at": NOW}]}
    )
    assert b.open["inc-2"].as_json()["actions"][0]["kind"] == "cordon"
    assert [line["change"] for line in b.recent] == ["opened", "action", "resolved"]


def test_a_replayed_event_is_applied_once() -> None:
    b = board.Board()
    assert b.apply(event("opened", "n0", 1)) is not None
    assert b.apply(event("opened", "n0", 1)) is None
    assert len(b.recent) == 1
    assert len(b.open["inc-1"].timeline) == 1


def test_the_ring_keeps_the_last_readings_oldest_first() -> None:
    f = fleet.Fleet(2, ring_len=3)
    for k in range(5):
        f.ingest("n0", frame("n0", [50.0 + k, 40.0]), NOW + k)
    s = f.series("n0", 0)
    assert s is not None
    assert s["ts"] == [NOW + 2, NOW + 3, NOW + 4]
    assert s["series"]["temp_c"] == [52.0, 53.0, 54.0]  # type: ignore[index]
    assert f.series("n0", 5) is None
    assert f.series("nope", 0) is None


def test_a_frame_with_more_gpus_than_expected_widens_the_map_keeping_what_was_there() -> None:
    f = fleet.Fleet(2, ring_len=3, capacity=1)
    f.ingest("n0", frame("n0", [50.0, 51.0]), NOW)
    f.ingest("n1", frame("n1", [60.0, 61.0, 62.0, 63.0]), NOW)
    assert f.gpus == 4
    assert f.temps_u8().tolist() == [[50, 51, 255, 255], [60, 61, 62, 63]]


def test_a_browser_that_cannot_keep_up_is_disconnected_not_buffered() -> None:
    lv = make(nodes=1)
    client, first = lv.connect()
    assert first.startswith(b"event: snapshot\ndata: ")
    for _ in range(live.CLIENT_QUEUE + 5):
        lv.broadcast("feed", {"x": 1})
    assert client not in lv.clients
    assert client.dropped
    assert client.queue.qsize() == 1
    assert client.queue.get_nowait() is None


def test_new_nodes_past_max_nodes_are_refused_and_counted() -> None:
    f = fleet.Fleet(2, ring_len=3, max_nodes=2)
    assert f.ingest("n0", frame("n0", [50.0, 50.0]), NOW)
    assert f.ingest("n1", frame("n1", [50.0, 50.0]), NOW)
    assert not f.ingest("intruder", frame("intruder", [50.0, 50.0]), NOW)
    assert f.ingest("n0", frame("n0", [51.0, 50.0]), NOW)
    assert (f.names, f.refused) == (["n0", "n1"], 1)
