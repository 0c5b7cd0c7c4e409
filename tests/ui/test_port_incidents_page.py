"""The page names the RDMA port of a port incident: in the incident list, the feed's lines and the node's
history, from the feed and from the controller's KV alike; the port is the incident's, not a node label."""

from __future__ import annotations

from datetime import UTC, datetime

from healer.schemas import incidents
from healer.ui import board


def port_event(port: str, incident_id: str) -> incidents.IncidentEvent:
    data = incidents.IncidentData(
        incident_id=incident_id, rule_id="rdma-port-down", severity="major", node="n1", state="open",
        summary="rdma-port-down on node n1 port " + port, labels={"category": "fabric", "port": port},
        mode="enforce",
    )  # fmt: skip
    return incidents.build(
        event_id=f"{incident_id}.1", cluster="c", change=incidents.Change.OPENED, data=data, ts=1.7e9
    )


def test_port_incidents_show_their_port_and_leave_the_nodes_labels_alone() -> None:
    b = board.Board()
    line = b.apply(port_event("mlx5_3/1", "inc-a"))
    assert line is not None
    assert line["port"] == "mlx5_3/1"
    b.apply(port_event("mlx5_6/1", "inc-b"))
    shown = sorted(s.as_json()["port"] for s in b.open.values())
    assert shown == ["mlx5_3/1", "mlx5_6/1"], "two incidents, each with its port"
    assert [h["port"] for h in b.node_history("n1")] == ["mlx5_3/1", "mlx5_6/1"]
    assert "port" not in b.node_labels.get("n1", {})


def test_a_port_incident_seeded_from_kv_keeps_its_port() -> None:
    b = board.Board()
    doc = {
        "id": "inc-k", "rule_id": "rdma-port-down", "severity": "major", "node": "n1", "port": "mlx5_0/1",
        "state": "open", "summary": "s", "mode": "enforce", "opened_at": datetime.now(UTC).timestamp(),
    }  # fmt: skip
    assert b.seed(doc)
    assert b.open["inc-k"].as_json()["port"] == "mlx5_0/1"
