"""The demo's Observer: faults from the simulator's truth matched to incidents from the feed."""

from __future__ import annotations

import rich.console

from healer.demo import view, watch
from healer.schemas import incidents, telemetry

T0 = 1_900_000_000.0


def _event(
    change: incidents.Change,
    inc_id: str,
    rule: str,
    node: str,
    gpu: int | None,
    at: float,
    actions: list[tuple[str, str, float]] | None = None,
    state: incidents.IncidentState = incidents.IncidentState.OPEN,
) -> incidents.IncidentEvent:
    data = incidents.IncidentData(
        incident_id=inc_id, rule_id=rule, severity="major", node=node, gpu_index=gpu, state=state,
        summary=f"{rule} on {node}", mode="enforce",
        actions=[incidents.ActionRecord(kind=k, status=s, at=T0 + a) for k, s, a in actions or []],
    )  # fmt: skip
    return incidents.build(
        event_id=f"{inc_id}.{change}", cluster="demo", change=change, data=data, ts=T0 + at
    )


def _truth(
    fid: str, kind: str, node: str, gpu: int | None, start: float, visible: float
) -> dict[str, object]:
    return {
        "id": fid,
        "kind": kind,
        "node": node,
        "gpu": gpu,
        "start": T0 + start,
        "visible_at": T0 + visible,
    }


def test_latency_runs_from_visible_to_the_first_action_that_changes_something() -> None:
    obs = watch.Observer(T0)
    obs.on_truth([_truth("f1", "nvlink_crc_rising", "n1", 2, 3.0, 4.0)])
    obs.on_incident(_event(incidents.Change.OPENED, "a", "nvlink-replay-recovery", "n1", 2, 5.0))
    obs.on_incident(
        _event(
            incidents.Change.ACTION, "a", "nvlink-replay-recovery", "n1", 2, 5.0, [("notify", "done", 5.0)]
        )
    )
    obs.on_incident(_event(incidents.Change.OPENED, "b", "nvlink-crc-storm", "n1", 2, 130.0))
    obs.on_incident(
        _event(incidents.Change.ACTION, "b", "nvlink-crc-storm", "n1", 2, 130.5, [("cordon", "done", 130.5)])
    )
    (row,) = obs.summary(duration_s=150, nodes=2, gpus=8, interrupted=False)["faults"]
    assert row["detected"] is True
    assert row["t_detected_s"] == 5.0
    assert row["first_action"] == "cordon:done"
    assert row["latency_to_action_s"] == 126.5
    assert row["rules"] == ["nvlink-crc-storm", "nvlink-replay-recovery"]


def test_node_fault_matches_node_incidents_and_other_nodes_count_as_unexpected() -> None:
    obs = watch.Observer(T0)
    obs.on_truth([_truth("f1", "node_silent", "n3", None, 4.0, 4.0)])
    obs.on_incident(_event(incidents.Change.OPENED, "a", "node-silent", "n3", None, 124.0))
    obs.on_incident(_event(incidents.Change.OPENED, "b", "gpu-temp-near-slowdown", "n9", 0, 50.0))
    s = obs.summary(duration_s=150, nodes=10, gpus=8, interrupted=False)
    assert s["faults_detected"] == 1
    assert s["incidents"]["unexpected"] == ["gpu-temp-near-slowdown on n9 GPU 0"]


def test_story_needs_the_overheat_incident_resolved_with_its_limit_restored() -> None:
    obs = watch.Observer(T0)
    obs.on_truth([_truth("f1", "cooling_degradation", "n1", 5, 1.0, 1.5)])
    capped: list[tuple[str, str, float]] = [("power_limit", "done", 40.0)]
    obs.on_incident(_event(incidents.Change.OPENED, "a", "gpu-temp-near-slowdown", "n1", 5, 39.0))
    obs.on_incident(_event(incidents.Change.ACTION, "a", "gpu-temp-near-slowdown", "n1", 5, 40.0, capped))
    story = obs.summary(duration_s=150, nodes=2, gpus=8, interrupted=False)["story"]
    assert story["overheat_capped"] is True
    assert story["overheat_resolved_and_restored"] is False
    restored: list[tuple[str, str, float]] = [
        *capped,
        ("restore_power_limit", "done", 90.0),
    ]
    obs.on_incident(
        _event(
            incidents.Change.RESOLVED,
            "a",
            "gpu-temp-near-slowdown",
            "n1",
            5,
            89.0,
            capped,
            incidents.IncidentState.RESOLVED,
        )
    )
    obs.on_incident(
        _event(
            incidents.Change.ACTION,
            "a",
            "gpu-temp-near-slowdown",
            "n1",
            5,
            90.0,
            restored,
            incidents.IncidentState.RESOLVED,
        )
    )
    story = obs.summary(duration_s=150, nodes=2, gpus=8, interrupted=False)["story"]
    assert story["overheat_resolved_and_restored"] is True


def test_breaker_incident_opens_the_breaker_and_mass_faults_print_as_one_line() -> None:
    obs = watch.Observer(T0)
    obs.on_truth([_truth(f"f{i}", "gsp_timeout", f"n{i}", 0, 140.0, 140.0) for i in range(4)])
    for i in range(4):
        obs.on_incident(_event(incidents.Change.OPENED, f"x{i}", "xid-fatal", f"n{i}", 0, 141.0))
        obs.on_incident(
            _event(
                incidents.Change.ACTION,
                f"x{i}",
                "xid-fatal",
                f"n{i}",
                0,
                141.0,
                [("cordon", "refused", 141.0)],
            )
        )
    obs.on_incident(
        _event(
            incidents.Change.ESCALATED,
            "cb",
            watch.BREAKER_RULE,
            "fleet",
            None,
            141.0,
            state=incidents.IncidentState.ESCALATED,
        )
    )
    s = obs.summary(duration_s=150, nodes=32, gpus=8, interrupted=False)
    assert s["story"]["breaker_tripped"] is True
    assert s["actions"] == {"cordon:refused": 4}
    assert s["cordoned_nodes"] == []
    text = view.summary_text(s)
    assert text.count("gsp_timeout") == 1
    assert "4 nodes (n0, n1, n2, ...)" in text


def _frame(node: str, ts: float, watts: float) -> telemetry.NodeFrame:
    gpus = [telemetry.GpuSample(index=i, power_w=watts) for i in range(2)]
    return telemetry.NodeFrame(
        node=node, ts=T0 + ts, seq=0, boot_id="b", agent_version="t", source="sim", gpus_expected=2, gpus=gpus
    )


def test_the_power_story_is_read_from_the_racks_frames_and_its_domain_incident() -> None:
    pw = watch.PowerWatch("rack=r1", frozenset({"n1", "n2"}), budget_w=1000.0)
    obs = watch.Observer(T0, power=pw)
    obs.on_frame(_frame("n1", 10.0, 200.0))
    obs.on_frame(_frame("n9", 10.0, 900.0))  # not in the rack
    obs.on_frame(_frame("n2", 10.0, 200.0))  # 400 + 400 W: under
    obs.on_frame(_frame("n1", 11.0, 400.0))  # 800 + 400 W: over
    obs.on_frame(_frame("n1", 20.0, 100.0))  # 200 + 400 W: back under
    assert (pw.over_at, pw.under_at, pw.peak_w) == (T0 + 11.0, T0 + 20.0, 1200.0)
    caps: list[tuple[str, str, float]] = [("power_limit", "done", 14.0 + i) for i in range(4)]
    obs.on_incident(_event(incidents.Change.OPENED, "p", watch.POWER_RULE, "rack.r1", None, 13.0))
    for i in range(4):
        obs.on_incident(
            _event(incidents.Change.ACTION, "p", watch.POWER_RULE, "rack.r1", None, 14.0 + i, caps[: i + 1])
        )
    s = obs.summary(duration_s=60, nodes=3, gpus=2, interrupted=False)
    assert s["story"]["rack_over_budget_capped"] is True
    assert s["story"]["rack_under_budget_no_job_stopped"] is True
    assert s["story"]["rack_restored_when_load_fell"] is False
    assert s["incidents"]["unexpected"] == [], "the budget's incident matches no fault and is expected"
    assert s["power"]["under_within_s"] == 9.0
    obs.on_incident(
        _event(incidents.Change.UPDATED, "p", watch.POWER_RULE, "rack.r1", None, 39.0, caps)
    )  # the next step
    restored = [*caps, *[("restore_power_limit", "done", 40.0 + i) for i in range(4)]]
    obs.on_incident(
        _event(
            incidents.Change.RESOLVED,
            "p",
            watch.POWER_RULE,
            "rack.r1",
            None,
            44.0,
            restored,
            incidents.IncidentState.RESOLVED,
        )
    )
    s = obs.summary(duration_s=60, nodes=3, gpus=2, interrupted=False)
    assert s["story"]["rack_restored_when_load_fell"] is True
    assert s["power"]["restored_s"] == 44.0
    lines = [line for _, line in obs.log]
    assert "rack=r1 over its power budget: 1.2 kW of 1.0 kW" in lines
    assert "actions on rack.r1: 4 x power_limit done" in lines, "one line per step, not per GPU"
    assert "actions on rack.r1: 4 x restore_power_limit done" in lines
    assert not [line for line in lines if line.startswith("action power_limit")]


def test_without_a_power_story_the_story_has_no_power_steps() -> None:
    s = watch.Observer(T0).summary(duration_s=60, nodes=3, gpus=2, interrupted=False)
    assert "power" not in s
    assert not [k for k in s["story"] if k.startswith("rack_") and "budget" in k]


def test_the_live_view_shows_the_power_storys_rack_against_its_budget() -> None:
    pw = watch.PowerWatch("rack=r1", frozenset({"n1"}), budget_w=1000.0)
    obs = watch.Observer(T0, power=pw)
    obs.on_frame(_frame("n1", 10.0, 600.0))
    assert "rack=r1=1.2/1.0kW" in view.status_line(obs, T0 + 10.0)
    assert "kW" not in view.status_line(watch.Observer(T0), T0 + 10.0)
    console = rich.console.Console(width=160, record=True)
    console.print(view.render(obs, T0 + 10.0, duration_s=60, header="test"))
    text = console.export_text()
    assert "power rack=r1" in text
    assert "1.2 kW of 1.0 kW" in text
