"""A fleet as an SRE meets it, for the status page's tests and its screenshots: an hour and more of
history, a node gone silent half an hour ago, one that never reported but has an incident, one only the
inventory knows, cordoned, drained and excluded nodes, an open breaker with its incident and node list, a
rejected rule reload, and a GPU whose anomaly score is missing. Pure state (``Live``), no NATS: the
sources that fill it from NATS are tested against a real server in test_server.py and test_node_view.py."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from healer import config
from healer.schemas import events, incidents, telemetry
from healer.ui import board, fleet, live

GPUS = 8
REPORTING = [f"gpu-{r}{i:02d}" for r in "abc" for i in range(1, 5) if f"{r}{i:02d}" not in ("c03", "c04")]
STALE = "gpu-b04"
"""Reported until 31 minutes ago."""
NEVER = "gpu-c03"
"""Never reported; has an open incident."""
INVENTORY_ONLY = "gpu-c04"
"""Admitted (the inventory), never reported, no incident."""
CORDONED, DRAINED, EXCLUDED, HOT = "gpu-a02", "gpu-a03", "gpu-b02", "gpu-a01"
ALL = sorted({*REPORTING, NEVER, INVENTORY_ONLY})
LABELS = {n: {"rack": f"r{'abc'.index(n[4]) + 1}"} for n in ALL}
HISTORY_S = 70 * 60
STEP_S = 20.0
LONG = "GPU 3 of gpu-a01 reached 88.4 C, 3.6 C under its slowdown temperature of 92 C, for 5 minutes " * 4
"""A summary of ~300 characters, as the thermal rule's are."""


def uuid(node: str, gpu: int) -> str:
    return (
        f"GPU-{abs(hash((node, gpu))) % 16**8:08x}-1111-2222-3333-{'abc'.index(node[4])}{node[-2:]}{gpu:06d}"
    )


def frame(node: str, t: float, at: float) -> telemetry.NodeFrame:
    """``node``'s frame ``t`` seconds from now (negative: the past), sent at ``at``."""
    gpus = []
    for g in range(GPUS):
        temp = 55 + 8 * math.sin(t / 900 + g) + (30 if node == HOT and g == 3 and t > -1200 else 0)
        gpus.append(
            telemetry.GpuSample(
                index=g,
                uuid=uuid(node, g),
                model="NVIDIA H100 80GB HBM3",
                temp_c=min(temp, 95.0),
                power_w=350 + 120 * math.sin(t / 600 + g),
                power_limit_w=700.0,
                util_gpu_pct=60.0 + 30 * math.sin(t / 300),
                sm_clock_mhz=1755.0,
                slowdown_temp_c=92.0,
            )
        )
    return telemetry.NodeFrame(
        node=node,
        ts=at,
        seq=0,
        boot_id="b",
        agent_version="test",
        source="sim",
        gpus_expected=GPUS,
        gpus=gpus,
    )


def event(
    incident_id: str,
    node: str,
    gpu: int | None,
    rule: str,
    severity: str,
    change: str,
    at: float,
    summary: str,
    **kw: Any,
) -> incidents.IncidentEvent:
    """One incident event; ``kw``: ``actions``, ``evidence``, ``state``, ``mode`` (enforce), ``seq``."""
    data = incidents.IncidentData.model_validate(
        {
            "incident_id": incident_id,
            "rule_id": rule,
            "severity": severity,
            "node": node,
            "gpu_index": gpu,
            "state": kw.get("state") or ("resolved" if change == "resolved" else "open"),
            "summary": summary,
            "evidence": kw.get("evidence") or {},
            "actions": kw.get("actions") or [],
            "labels": LABELS.get(node, {}),
            "mode": kw.get("mode", "enforce"),
        }
    )
    return incidents.IncidentEvent.model_validate(
        {
            "id": f"{incident_id}.{kw.get('seq', 1)}",
            "source": "healer://test/controller",
            "type": incidents.event_type(change),  # type: ignore[arg-type]
            "subject": incidents.subject_of(node, gpu),
            "time": datetime.fromtimestamp(at, tz=UTC),
            "data": data,
        }
    )


def done(kind: str, at: float, detail: str = "") -> incidents.ActionRecord:
    return incidents.ActionRecord(kind=kind, status="done", detail=detail or f"{kind} done", at=at)


GRAFANA = "http://grafana.invalid/d/healer-overview?var-node={node}&var-gpu={gpu}"
VERSIONS = {"vbios_version": "96.00.89.00.01", "driver_version": "550.54.15"}
BREAKER = (
    "circuit breaker open: 4 nodes in 3600s would exceed 3. healer takes no more nodes out of service "
    "until `healer breaker reset`."
)


def _history(lv: live.Live, now: float) -> None:
    t = now - HISTORY_S
    while t <= now:
        for node in REPORTING:
            if node == STALE and t > now - 31 * 60:
                continue
            lv.fleet.ingest(node, frame(node, t - now, t), t)
        t += STEP_S
    for node in REPORTING:  # the last seconds at the agents' rate, for the ring
        if node != STALE:
            for k in range(5, 0, -1):
                lv.fleet.ingest(node, frame(node, -k, now - k), now - k)


def _incidents(b: board.Board, now: float) -> None:
    hot = {"temp_c": 88.4, "slowdown_temp_c": 92.0}
    capped = [done("power_limit", now - 540, "power limit 700 W -> 560 W")]
    rule = "gpu-temp-near-slowdown"
    b.apply(event("inc-hot", HOT, 3, rule, "warning", "opened", now - 600, LONG, evidence=hot))
    b.apply(
        event(
            "inc-hot", HOT, 3, rule, "warning", "action", now - 540, LONG, evidence=hot, actions=capped, seq=2
        )
    )
    b.apply(
        event(
            "inc-hot",
            HOT,
            3,
            rule,
            "warning",
            "updated",
            now - 300,
            LONG,
            evidence=hot,
            actions=capped,
            seq=3,
        )
    )
    for i, (ago, code, gpu) in enumerate(((1205, 79, 5), (4000, 31, 2))):
        xid = events.NodeEvent(
            id=f"x{i}", node=CORDONED, ts=now - ago, kind="xid", xid=code, gpu_index=gpu,
            message=f"NVRM: Xid (PCI:0000:{gpu:02x}:00): {code}",
        )  # fmt: skip
        b.xid(xid, CORDONED)
    cordon = [done("cordon", now - 1190)]
    b.apply(
        event("inc-xid", CORDONED, 5, "xid-fatal", "critical", "action", now - 1200,
              "XID 79 on GPU 5: fallen off the bus", actions=cordon, evidence={"xid": 79, **VERSIONS})
    )  # fmt: skip
    drained = [done("drain", now - 890), done("migrate", now - 880)]
    b.apply(
        event("inc-dbe", DRAINED, 2, "ecc-dbe", "critical", "action", now - 900,
              "double-bit ECC error on GPU 2", actions=drained, evidence={"ecc_dbe_volatile": 2})
    )  # fmt: skip
    lifted = [done("cordon", now - 3500), done("uncordon", now - 3010)]
    b.apply(
        event("inc-old", CORDONED, 1, "nvlink-crc", "major", "resolved", now - 3000,
              "NVLink CRC errors on GPU 1", actions=lifted)
    )  # fmt: skip
    b.apply(
        event(
            "inc-silent", NEVER, None, "node-silent", "major", "opened", now - 2400, "no telemetry for 2 min"
        )
    )
    counted = {"nodes": f"{CORDONED},{DRAINED},gpu-b01,gpu-b03", "limit": 3}
    b.apply(
        event("inc-breaker", board.FLEET_NODE, None, "circuit-breaker", "critical", "escalated", now - 120,
              BREAKER, evidence=counted, state="escalated")
    )  # fmt: skip
    b.set_exclusion(EXCLUDED, {"by": "ops", "reason": "PSU swap", "at": now - 7200})
    entries = [[CORDONED, now - 1190, "inc-xid"], [DRAINED, now - 890, "inc-dbe"]]
    reason = "4 nodes in 3600s would exceed 3"
    b.set_breaker({"open": True, "opened_at": now - 120, "reason": reason, "entries": entries})
    problem = incidents.RuleProblem(
        path="/etc/healer/rules/thermal.yaml", line=12, col=7, message="unknown field 'tmep_c'"
    )
    rejected = incidents.RulesRejectedData(rules_dir="/etc/healer/rules", kept_rules=31, errors=[problem])
    b.rules_rejected(
        incidents.RulesRejectedEvent(
            id="rr-1",
            source="healer://test/controller",
            time=datetime.fromtimestamp(now - 60, tz=UTC),
            data=rejected,
        )
    )


def build(now: float, *, grafana_url: str | None = GRAFANA) -> tuple[live.Live, config.UiSettings]:
    ui = config.UiSettings(port=0, push_s=0.3, stale_after_s=30.0, grafana_url=grafana_url)
    lv = live.Live(
        fleet.Fleet(GPUS, ring_len=90, history_len=ui.history_len, history_step_s=ui.history_step_s),
        board.Board(),
        stale_after_s=ui.stale_after_s,
        title="healer · test",
        admitted=lambda: ALL,
        links={"grafana": ui.grafana_url},
    )
    lv.extra_labels = LABELS
    _history(lv, now)
    _incidents(lv.board, now)
    return lv, ui


class MissingScore:
    """The controller's model has not scored this GPU yet: a component present, its value missing (NaN,
    which the page's JSON carries as null)."""

    def components(self, node: str, gpu: int) -> dict[str, float] | None:
        return {"anomaly_score": float("nan"), "thermal_rise": 0.12} if node == HOT else None
