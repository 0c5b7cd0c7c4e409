"""The recovery ladder's pure state machine: every path from contain to back-in-service or replacement."""

from __future__ import annotations

import json

import pytest

from healer import actions
from healer.controller.remediation import ladder
from healer.rules import recovery

Out = ladder.Outcome
K = ladder.StepKind
P = ladder.Phase
DAY = 86400.0
FULL = recovery.Ladder(id="fatal", rules=("xid-fatal",), steps=("reset_gpu", "reboot_node"))
EMPTY = ladder.History()


def _start(lad: recovery.Ladder = FULL, now: float = 1000.0) -> ladder.Step:
    return ladder.start(lad, incident_id="inc-1", node="gpu01", gpu_uuid="GPU-1", gpu_index=3, now=now)


def _walk(step: ladder.Step, *outcomes: Out, history: ladder.History = EMPTY) -> list[ladder.Step]:
    steps = [step]
    now = step.state.updated_at
    for outcome in outcomes:
        now += 10.0
        steps.append(ladder.next_step(steps[-1].state, outcome, now, history))
    return steps


def test_a_ladder_starts_by_containing() -> None:
    step = _start()
    assert step.kind is K.CONTAIN
    assert step.state.phase is P.CONTAINING
    assert step.deadline == 1000.0 + ladder.CONTAIN_BUDGET_S


def test_a_reset_that_validates_returns_the_node_to_service() -> None:
    steps = _walk(_start(), Out.CONTAINED, Out.DONE, Out.PASSED, Out.RETURNED)
    assert [s.kind for s in steps] == [K.CONTAIN, "reset_gpu", K.VALIDATE, K.RETURN_TO_SERVICE, K.NONE]
    assert steps[-1].state.phase is P.RETURNED
    assert steps[-1].state.finished
    assert steps[2].soak_s == 600.0
    assert steps[2].dcgm_level == 1
    assert steps[2].deadline == steps[2].state.updated_at + 600.0 + ladder.VALIDATE_MARGIN_S
    assert [t.outcome for t in steps[-1].state.transitions] == [
        Out.CONTAINED,
        Out.DONE,
        Out.PASSED,
        Out.RETURNED,
    ]


@pytest.mark.parametrize("failure", [[Out.FAILED], [Out.DONE, Out.VALIDATION_FAILED], [Out.DONE, Out.FAILED]])
def test_a_failed_reset_or_validation_leads_to_a_reboot(failure: list[Out]) -> None:
    steps = _walk(_start(), Out.CONTAINED, *failure)
    assert steps[-1].kind == "reboot_node"
    assert steps[-1].state.phase is P.REBOOTING
    assert steps[-1].deadline == steps[-1].state.updated_at + actions.REBOOT_BUDGET_S
    back = _walk(steps[-1], Out.DONE, Out.PASSED, Out.RETURNED)
    assert [s.kind for s in back[1:]] == [K.VALIDATE, K.RETURN_TO_SERVICE, K.NONE]


def test_a_failed_reboot_or_its_validation_ends_in_replacement() -> None:
    steps = _walk(_start(), Out.CONTAINED, Out.FAILED, Out.DONE, Out.VALIDATION_FAILED)
    assert steps[-1].kind is K.REPLACE
    assert steps[-1].state.phase is P.REPLACEMENT
    assert "reboot_node did not bring the GPU back" in steps[-1].reason
    steps = _walk(_start(), Out.CONTAINED, Out.FAILED, Out.FAILED)
    assert steps[-1].kind is K.REPLACE


def test_a_refused_reset_is_asked_again_later_then_counts_as_failed() -> None:
    steps = _walk(_start(), Out.CONTAINED, *[Out.REFUSED] * (ladder.MAX_REFUSALS - 1))
    for s in steps[2:]:
        assert s.kind == "reset_gpu"
        assert s.not_before == s.state.updated_at + ladder.REFUSAL_RETRY_S
    assert steps[-1].state.refusals == ladder.MAX_REFUSALS - 1
    last = ladder.next_step(steps[-1].state, Out.REFUSED, 9999.0, EMPTY, detail="pid 42 runs")
    assert last.kind == "reboot_node"
    assert last.state.refusals == 0


def test_the_second_recovery_of_a_gpu_within_30_days_goes_to_replacement() -> None:
    history = ladder.History((1000.0 - 29 * DAY,))
    steps = _walk(_start(), Out.CONTAINED, history=history)
    assert steps[-1].kind is K.REPLACE
    assert "recovery number 2 of this GPU within 30 days (limit 2)" in steps[-1].reason
    old = ladder.History((1000.0 - 31 * DAY,))
    assert _walk(_start(), Out.CONTAINED, history=old)[-1].kind == "reset_gpu"


def test_a_contact_support_ladder_goes_straight_to_replacement() -> None:
    cs = recovery.Ladder(id="cs", rules=("row-remap-failure",), steps=(), contact_support=True)
    steps = _walk(_start(cs), Out.CONTAINED)
    assert steps[-1].kind is K.REPLACE
    assert "contact support" in steps[-1].reason
    assert not steps[-1].state.attempted_recovery


@pytest.mark.parametrize("before", [[Out.CONTAINED], [Out.CONTAINED, Out.FAILED]])
def test_a_node_that_recovered_while_its_domain_held_the_rung_is_returned_without_it(
    before: list[Out],
) -> None:
    """#27: a shared-cause incident held the reset (or, after a failed reset, the reboot); the node came
    back by itself: straight to the return to service, and the held rung counts as no recovery."""
    steps = _walk(_start(), *before, Out.RECOVERED, Out.RETURNED)
    assert [s.kind for s in steps][-2:] == [K.RETURN_TO_SERVICE, K.NONE]
    assert steps[-1].state.phase is P.RETURNED
    assert "returned without" in steps[-2].reason
    assert steps[-1].state.attempted_recovery == (len(before) > 1), "only a rung that ran counts"


def test_a_replacement_held_by_a_domain_returns_the_node_once_it_recovered() -> None:
    cs = recovery.Ladder(id="cs", rules=("row-remap-failure",), steps=(), contact_support=True)
    steps = _walk(_start(cs), Out.RECOVERED, Out.RETURNED)
    assert [s.kind for s in steps] == [K.CONTAIN, K.RETURN_TO_SERVICE, K.NONE]
    assert not steps[-1].state.attempted_recovery


def test_a_reboot_only_ladder_starts_with_the_reboot() -> None:
    rb = recovery.Ladder(id="rb", rules=("gpu-lost-event",), steps=("reboot_node",))
    steps = _walk(_start(rb), Out.CONTAINED, Out.DONE, Out.VALIDATION_FAILED)
    assert [s.kind for s in steps] == [K.CONTAIN, "reboot_node", K.VALIDATE, K.REPLACE]


def test_containment_that_never_finishes_moves_to_the_reboot_which_drains_by_itself() -> None:
    assert _walk(_start(), Out.FAILED)[-1].kind == "reboot_node"
    reset_only = recovery.Ladder(id="r", rules=("x",), steps=("reset_gpu",))
    assert _walk(_start(reset_only), Out.FAILED)[-1].kind is K.REPLACE


def test_a_node_that_cannot_be_returned_stays_out_for_replacement() -> None:
    steps = _walk(_start(), Out.CONTAINED, Out.DONE, Out.PASSED, Out.FAILED)
    assert steps[-1].kind is K.REPLACE


def test_an_operator_can_stop_a_ladder_at_any_phase_and_it_says_who() -> None:
    for n in range(4):
        steps = _walk(_start(), *[Out.CONTAINED, Out.DONE, Out.PASSED][:n])
        stopped = ladder.next_step(steps[-1].state, Out.STOPPED, 5000.0, EMPTY, detail="alice")
        assert stopped.kind is K.NONE
        assert stopped.state.phase is P.STOPPED
        assert stopped.state.transitions[-1] == ladder.Transition(
            5000.0, steps[-1].state.phase, Out.STOPPED, "alice"
        )


def test_a_finished_ladder_does_nothing_more() -> None:
    done = _walk(_start(), Out.CONTAINED, Out.DONE, Out.PASSED, Out.RETURNED)[-1].state
    again = ladder.next_step(done, Out.FAILED, 9000.0, EMPTY)
    assert again.kind is K.NONE
    assert again.state == done


def test_an_outcome_the_phase_cannot_have_is_a_bug_not_data() -> None:
    with pytest.raises(ValueError, match="cannot follow phase CONTAINING"):
        ladder.next_step(_start().state, Out.PASSED, 2000.0, EMPTY)


def test_state_survives_a_json_round_trip_through_kv() -> None:
    for step in _walk(_start(), Out.CONTAINED, Out.REFUSED, Out.FAILED, Out.DONE):
        doc = json.loads(json.dumps(step.state.to_json()))
        assert ladder.LadderState.from_json(doc) == step.state


def test_history_counts_ladders_that_tried_a_rung() -> None:
    tried = _walk(_start(), Out.CONTAINED, Out.DONE, Out.PASSED, Out.RETURNED)[-1].state
    cs = recovery.Ladder(id="cs", rules=("r",), steps=(), contact_support=True)
    not_tried = _walk(_start(cs), Out.CONTAINED)[-1].state
    h = ladder.History((1000.0 - 100 * DAY, 1000.0 - DAY)).record(tried)
    assert h.recoveries == (1000.0 - DAY, 1000.0)
    assert h.record(not_tried) == h
    assert ladder.History.from_json(json.loads(json.dumps(h.to_json()))) == h
    assert h.within(1000.0, 2 * DAY) == 2


def test_dry_run_plan_lists_every_rung_and_the_replacement() -> None:
    assert ladder.plan(FULL) == (
        "contain (the rule's actions)",
        "reset_gpu (refused or failed: reboot_node)",
        "validate (600s soak, dcgmi diag -r 1; pass: return_to_service, fail: reboot_node)",
        "reboot_node (refused or failed: hardware_replacement)",
        "validate (600s soak, dcgmi diag -r 1; pass: return_to_service, fail: hardware_replacement)",
        "hardware_replacement at once when this is the GPU's recovery number 2 within 30 days",
    )


def test_the_evidence_bundle_carries_the_device_and_the_steps_taken() -> None:
    state = _walk(_start(), Out.CONTAINED, Out.FAILED, Out.FAILED)[-1].state
    device = {
        "serial": "1650",
        "uuid": "GPU-1",
        "board_part_number": "699-2G",
        "vbios": "96.00",
        "driver": "550",
    }
    bundle = ladder.evidence(state, EMPTY, device, [{"kind": "xid", "xid": 48}], {"temp_c_max": 71.0})
    assert bundle["device"] == device
    assert [s["phase"] for s in bundle["steps_taken"]] == ["containing", "resetting", "rebooting"]
    assert bundle["triggering_events"] == [{"kind": "xid", "xid": 48}]
    assert json.loads(json.dumps(bundle)) == bundle


# -- the port link-reset rung (#26) -------------------------------------------------------------------
FABRIC = recovery.Ladder(
    id="fabric", rules=("rdma-port-down",), steps=("reset_port", "reboot_node"), dcgm_level=0
)


def _port_start(port: str | None = "mlx5_3/1") -> ladder.Step:
    return ladder.start(
        FABRIC, incident_id="inc-p", node="ib01", gpu_uuid=None, gpu_index=None, now=1000.0, port=port
    )


def test_a_port_fault_bounces_its_link_validates_and_returns_without_a_reboot() -> None:
    steps = _walk(_port_start(), Out.CONTAINED, Out.DONE, Out.PASSED, Out.RETURNED)
    assert [s.kind for s in steps] == [K.CONTAIN, "reset_port", K.VALIDATE, K.RETURN_TO_SERVICE, K.NONE]
    assert steps[1].state.phase is P.PORT_RESETTING
    assert steps[1].deadline == steps[1].state.updated_at + actions.PORT_RESET_BUDGET_S
    assert steps[2].reason == "validate after reset_port"
    assert steps[-1].state.phase is P.RETURNED
    assert steps[-1].state.port == "mlx5_3/1"


@pytest.mark.parametrize("failure", [[Out.FAILED], [Out.DONE, Out.VALIDATION_FAILED], [Out.DONE, Out.FAILED]])
def test_a_port_that_does_not_come_back_leads_to_the_reboot(failure: list[Out]) -> None:
    steps = _walk(_port_start(), Out.CONTAINED, *failure)
    assert steps[-1].kind == "reboot_node"
    assert steps[-1].state.phase is P.REBOOTING
    assert steps[-1].reason.startswith("reset_port ")
    assert steps[-1].reason.endswith("; next rung: reboot_node")
    back = _walk(steps[-1], Out.DONE, Out.PASSED, Out.RETURNED)
    assert [s.kind for s in back[1:]] == [K.VALIDATE, K.RETURN_TO_SERVICE, K.NONE]
    assert back[-1].state.attempted_recovery


def test_a_reboot_that_does_not_bring_the_port_back_ends_in_replacement_naming_the_port() -> None:
    steps = _walk(_port_start(), Out.CONTAINED, Out.FAILED, Out.DONE, Out.VALIDATION_FAILED)
    assert steps[-1].kind is K.REPLACE
    assert "reboot_node did not bring port mlx5_3/1 back" in steps[-1].reason


def test_a_refused_port_reset_is_asked_again_later() -> None:
    steps = _walk(_port_start(), Out.CONTAINED, Out.REFUSED)
    assert steps[-1].kind == "reset_port"
    assert steps[-1].not_before == steps[-1].state.updated_at + ladder.REFUSAL_RETRY_S


def test_an_incident_without_a_port_skips_the_port_reset_and_reboots() -> None:
    steps = _walk(_port_start(port=None), Out.CONTAINED)
    assert steps[-1].kind == "reboot_node"
    assert steps[-1].state.rung == 1
    only = recovery.Ladder(id="p", rules=("r",), steps=("reset_port",))
    start = ladder.start(only, incident_id="i", node="n", gpu_uuid=None, gpu_index=None, now=1.0)
    step = ladder.next_step(start.state, Out.CONTAINED, 2.0, EMPTY)
    assert step.kind is K.REPLACE
    assert "reset_port needs the incident's port" in step.reason


def test_a_port_ladder_survives_a_round_trip_through_kv_json() -> None:
    step = _walk(_port_start(), Out.CONTAINED)[-1]
    doc = json.loads(json.dumps(step.state.to_json()))
    assert doc["phase"] == "PORT_RESETTING"
    again = ladder.LadderState.from_json(doc)
    assert again == step.state
    older = {k: v for k, v in doc.items() if k != "port"}  # a state stored before ports had a rung
    assert ladder.LadderState.from_json(older).port is None


def test_a_rule_file_keeps_reset_port_before_the_reboot() -> None:
    spec = recovery.LadderSpec(id="f", rules=["r"], steps=["reset_port", "reboot_node"])
    assert recovery.build(spec, "f.yaml", 1).steps == ("reset_port", "reboot_node")
    with pytest.raises(ValueError, match="in the order reset_gpu, reset_port, reboot_node"):
        recovery.LadderSpec(id="f", rules=["r"], steps=["reboot_node", "reset_port"])


def test_dry_run_plans_the_port_reset_only_for_an_incident_with_a_port() -> None:
    with_port = ladder.plan(FABRIC, "mlx5_3/1")
    assert with_port[1] == "reset_port mlx5_3/1 (refused or failed: reboot_node)"
    assert with_port[3] == "reboot_node (refused or failed: hardware_replacement)"
    assert not [line for line in ladder.plan(FABRIC) if line.startswith("reset_port")]


def test_the_ladder_reads_its_rungs_from_the_registry() -> None:
    """Each rung is a registered kind whose ``Rung`` names a ladder phase and a budget (#40); the ladder's
    own steps after a rung are registered kinds too."""
    rungs = [actions.spec(r).rung for r in recovery.RUNGS]
    assert recovery.RUNGS == ["reset_gpu", "reset_port", "reboot_node"]
    assert [r.order for r in rungs if r is not None] == sorted(r.order for r in rungs if r is not None)
    for rung in rungs:
        assert rung is not None
        assert ladder.Phase[rung.phase] not in ladder.TERMINAL
        assert rung.budget_s > 0
    # The names a running fleet stored in KV (docs/remediation.md, "Adding an action"): never renamed.
    assert [r.phase for r in rungs if r is not None] == ["RESETTING", "PORT_RESETTING", "REBOOTING"]
    assert ladder.rung_phases() == {
        ladder.Phase.RESETTING,
        ladder.Phase.PORT_RESETTING,
        ladder.Phase.REBOOTING,
    }
    own = {ladder.StepKind.VALIDATE, ladder.StepKind.RETURN_TO_SERVICE, ladder.StepKind.REPLACE}
    assert own <= set(actions.CATALOG)
    assert {ladder.step_kind(k) for k in ("reset_port", "contain")} == {"reset_port", ladder.StepKind.CONTAIN}
    with pytest.raises(ValueError, match="no ladder step"):
        ladder.step_kind("cordon")
