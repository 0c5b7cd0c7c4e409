"""The controller's decisions without NATS, KV or a clock: firings to incident changes, and the gates."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from healer import actions, config
from healer.controller.core import incident_shell
from healer.controller.incidents import book, correlation, decide, gates
from healer.rules import engine, ruleset
from healer.schemas import fields, incidents

SETTINGS = config.ControllerSettings(action_cooldown_s=600, actions_per_minute=2, repeat_faults=3)

HOT = ruleset.Rule(
    id="hot",
    severity="major",
    scope=fields.Scope.GPU,
    description="too hot",
    labels={"team": "gpu"},
    actions=(actions.build("power_limit", {"percent_of_default": 80}),),
    on_resolve=(actions.build("restore_power_limit", None),),
)


def firing(status: Any = "fired", **evidence: Any) -> engine.Firing:
    return engine.Firing(HOT, "n1", 2, status, since=10.0, at=10.0, evidence=evidence or {"t": 90})


def incident(**overrides: Any) -> book.Incident:
    return decide.new_incident(firing(), "inc-1", 10.0, incidents.Mode.ENFORCE, 1, SETTINGS).model_copy(
        update=overrides
    )


def attempt(**overrides: Any) -> gates.Attempt:
    base = gates.Attempt(
        kind="cordon", params={}, on_resolve=False, node="n1", incident_id="inc-1", now=1000.0,
        mode=incidents.Mode.ENFORCE, settings=SETTINGS, excluded=None, limits=gates.LimitsView(),
        lease_valid=True,
    )  # fmt: skip
    return dataclasses.replace(base, **overrides)


# -- incident changes ------------------------------------------------------------------------------
def test_a_firing_without_an_incident_opens_one_with_the_rules_actions() -> None:
    assert decide.on_firing(firing(), None).change is decide.Change.OPEN
    inc = incident()
    assert inc.summary == "hot on node n1 GPU 2: too hot"
    assert [a.kind for a in inc.actions] == ["power_limit"]
    assert inc.labels == {"team": "gpu"}
    assert inc.evidence == {"t": 90}
    assert not inc.escalated


def test_firing_again_refreshes_the_evidence_and_ongoing_only_marks_it_seen() -> None:
    again = decide.on_firing(firing(t=95), incident())
    assert again.change is decide.Change.REFRESH
    assert again.evidence == {"t": 95}
    assert decide.on_firing(firing("firing"), incident()).change is decide.Change.SEEN


def test_resolving_queues_the_on_resolve_actions_unless_the_node_was_forgotten() -> None:
    done = decide.on_firing(firing("resolved", t=60), incident())
    assert done.change is decide.Change.RESOLVE
    assert done.evidence == {"resolve.t": 60}
    assert [(a.kind, a.on_resolve) for a in done.on_resolve] == [("restore_power_limit", True)]
    gone = decide.on_firing(firing("resolved", reason=engine.FORGOTTEN), incident())
    assert gone.change is decide.Change.RESOLVE
    assert gone.on_resolve == ()
    assert decide.on_firing(firing("resolved"), None).change is decide.Change.NONE
    assert (
        decide.on_firing(firing("resolved"), incident(state=incidents.IncidentState.RESOLVED)).change
        is decide.Change.NONE
    )


def test_the_third_fault_episode_on_a_gpu_asks_for_inspection() -> None:
    inc = decide.new_incident(firing(), "inc-2", 10.0, incidents.Mode.ENFORCE, 3, SETTINGS)
    assert inc.escalated
    assert "fault #3" in inc.summary
    assert [a.kind for a in inc.actions] == ["power_limit", "inspect"]


def test_episodes_fold_openings_within_two_minutes_and_age_out() -> None:
    t = 1_000_000.0
    assert decide.episodes([t, t + 2], t + 5, 3600).count == 1, "one DBE fires several rules at once"
    assert decide.episodes([t], t + decide.EPISODE_S, 3600).count == 2
    assert decide.episodes([t], t + 3600, 3600) == decide.Episodes((t + 3600,), 1), "old openings age out"
    assert len(decide.episodes([t + i for i in range(60)], t + 61, 3600).times) == 50


def test_the_ladder_cordons_an_incident_the_power_cap_did_not_help() -> None:
    inc = incident()
    later = inc.opened_at + SETTINGS.power_cap_escalate_s + 1
    assert decide.ladder_step(inc, later, SETTINGS) is None, "no cap yet"
    inc.actions[0].status = incidents.ActionStatus.DONE
    assert decide.ladder_step(inc, inc.opened_at + 1, SETTINGS) is None, "too soon"
    step = decide.ladder_step(inc, later, SETTINGS)
    assert step is not None
    assert step.add is not None
    assert step.add.kind == "cordon"
    assert step.note == decide.LADDER_NOTE
    assert [a.kind for a in inc.actions] == ["power_limit"], "decide changes nothing: the shell applies it"
    incident_shell.escalate(inc, step)
    assert inc.escalated
    assert inc.summary.endswith(decide.LADDER_NOTE)
    assert decide.ladder_step(inc, later, SETTINGS) is None, "cordoned once"


# -- gates -----------------------------------------------------------------------------------------
def test_a_plain_cordon_passes_every_gate() -> None:
    assert gates.gate(attempt()) == gates.ALLOW


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"mode": "observe"},
            gates.Verdict.settle(incidents.ActionStatus.SKIPPED, "observe mode: incidents only"),
        ),
        (
            {"kind": "notify", "params": {"message": "hi"}},
            gates.Verdict.settle(incidents.ActionStatus.DONE, "hi"),
        ),
        ({"kind": "notify"}, gates.Verdict.settle(incidents.ActionStatus.DONE, "incident published")),
        ({"lease_valid": False}, gates.Verdict.wait("not the leader any more")),
    ],
)
def test_each_gate_gives_its_verdict(change: dict[str, Any], expected: gates.Verdict) -> None:
    assert gates.gate(attempt(**change)) == expected


def test_gpu_resets_and_excluded_nodes_are_skipped() -> None:
    reset = gates.gate(attempt(kind="reset_gpu"))
    assert reset.gate is gates.Gate.SETTLE
    assert reset.status == "skipped"
    assert "recovery-ladder step" in reset.reason
    assert gates.gate(attempt(kind="reset_gpu", ladder_step=True)).allowed
    excluded = gates.gate(attempt(excluded={"by": "ops", "reason": "bios"}))
    assert excluded == gates.Verdict.settle(
        incidents.ActionStatus.SKIPPED, "node excluded for maintenance by ops: bios"
    )
    rung = gates.gate(attempt(kind="reboot_node", ladder_step=True, excluded={"by": "ops", "reason": "x"}))
    assert rung.status == "skipped"  # exclusions apply to every rung


def test_reboots_wait_at_max_concurrent_reboots() -> None:
    s = config.ControllerSettings(max_concurrent_reboots=2)
    assert gates.gate(attempt(kind="reboot_node", settings=s, reboots_elsewhere=1)).allowed
    at_limit = gates.gate(attempt(kind="reboot_node", settings=s, reboots_elsewhere=2))
    assert at_limit.gate is gates.Gate.WAIT
    assert "max_concurrent_reboots" in at_limit.reason
    assert gates.gate(attempt(kind="cordon", settings=s, reboots_elsewhere=5)).allowed


def test_a_ladders_return_to_service_only_lifts_healers_own_cordon() -> None:
    ours = gates.gate(attempt(kind="return_to_service", ladder_step=True, cordon_ours=True))
    assert ours.allowed
    theirs = gates.gate(attempt(kind="return_to_service", ladder_step=True, cordon_ours=False))
    assert theirs.status == "skipped"
    assert "did not take this node out" in theirs.reason
    held = gates.gate(attempt(kind="return_to_service", cordon_ours=True, held_elsewhere=True))
    assert held.status == "skipped"
    assert "another open incident" in held.reason


def test_observe_mode_is_decided_before_anything_else() -> None:
    v = gates.gate(attempt(mode="observe", lease_valid=False, excluded={"by": "x"}))
    assert v.reason == "observe mode: incidents only"


def test_cooldown_waits_for_another_incident_but_not_for_the_same_one() -> None:
    view = gates.LimitsView(last=gates.LastAction(900.0, "inc-0"))
    waits = gates.gate(attempt(kind="power_limit", limits=view))
    assert waits == gates.Verdict.wait("cooldown: power_limit on n1 100s ago for inc-0")
    assert gates.gate(attempt(kind="power_limit", limits=view, incident_id="inc-0")).allowed
    assert gates.gate(attempt(kind="power_limit", limits=view, now=1501.0)).allowed


def test_rate_limit_waits_when_the_minute_is_full() -> None:
    full = gates.gate(attempt(limits=gates.LimitsView(window=(990.0, 995.0))))
    assert full == gates.Verdict.wait("rate limit: 2 cordon actions in the last minute")
    assert gates.gate(attempt(limits=gates.LimitsView(window=(995.0,)))).allowed


def test_an_uncordon_only_undoes_our_own_cordon_on_a_node_nobody_else_holds() -> None:
    uncordon = {"kind": "uncordon", "on_resolve": True}
    assert gates.gate(attempt(**uncordon, cordon_ours=True)).allowed
    for other in ({"cordon_ours": False}, {"cordon_ours": True, "held_elsewhere": True}):
        v = gates.gate(attempt(**uncordon, **other))
        assert v == gates.Verdict.settle(
            incidents.ActionStatus.SKIPPED, "another open incident still holds this node cordoned"
        )


def test_ownership_reads_the_incidents() -> None:
    mine = incident(actions=[book.PlannedAction(kind="drain", status="done")])
    assert gates.cordon_ours(mine)
    assert not gates.cordon_ours(incident(actions=[book.PlannedAction(kind="power_limit", status="done")]))
    other = incident(id="inc-9", actions=[book.PlannedAction(kind="inspect", status="planned")])
    assert gates.held_elsewhere(mine, [mine, other])
    assert not gates.held_elsewhere(mine, [mine, other.model_copy(update={"node": "n2"})])
    assert not gates.held_elsewhere(mine, [mine])


# -- the circuit breaker ---------------------------------------------------------------------------
BREAKER = config.ControllerSettings(breaker_max_nodes=2, breaker_max_percent=100.0, breaker_window_s=600)


def test_the_breaker_counts_nodes_and_trips_on_the_one_too_many() -> None:
    empty: dict[str, Any] = {"open": False, "entries": []}
    first = gates.breaker_admission(empty, "n1", 100, "inc-1", 1000.0, BREAKER)
    assert first.allowed
    assert not first.tripped
    assert first.reason == "1 of 2 in the window"
    assert first.state == {"open": False, "entries": [["n1", 1000.0, "inc-1"]]}
    assert first.state is not None
    again = gates.breaker_admission(first.state, "n1", 100, "inc-7", 1001.0, BREAKER)
    assert again.allowed, "a node is counted once"
    assert again.state is None, "a node is counted once: nothing to write"
    second = gates.breaker_admission(first.state, "n2", 100, "inc-2", 1002.0, BREAKER)
    assert second.allowed
    assert second.state is not None
    third = gates.breaker_admission(second.state, "n3", 100, "inc-3", 1003.0, BREAKER)
    assert not third.allowed
    assert third.tripped
    assert third.reason == "3 nodes in 600s would exceed the limit of 2 (fleet of 100)"
    assert third.state is not None
    assert third.state["open"]
    assert third.state["refused"] == ["n3", "inc-3"]
    refused = gates.breaker_admission(third.state, "n4", 100, "inc-4", 1004.0, BREAKER)
    assert not refused.allowed
    assert not refused.tripped
    assert refused.state is None
    assert refused.reason.startswith("circuit breaker open since 1003.0")


def test_breaker_entries_age_out_of_the_window() -> None:
    old = {"open": False, "entries": [["n1", 0.0, "inc-1"], ["n2", 0.0, "inc-2"]]}
    later = gates.breaker_admission(old, "n3", 100, "inc-3", 601.0, BREAKER)
    assert later.allowed
    assert later.state == {"open": False, "entries": [["n3", 601.0, "inc-3"]]}
    assert gates.BreakerEntry.of(["n1", "5", "inc"]) == gates.BreakerEntry("n1", 5.0, "inc")


def test_the_breaker_limit_is_the_smaller_of_nodes_and_percent_but_at_least_one() -> None:
    s = config.ControllerSettings(breaker_max_nodes=5, breaker_max_percent=10.0)
    assert [gates.limit_of(n, s) for n in (1, 30, 100)] == [1, 3, 5]


def test_the_catalogue_says_who_runs_each_action() -> None:
    assert actions.SCHEDULER_VERBS == ["cordon", "uncordon", "migrate"]
    # a reboot takes capacity out (the breaker counts it); a replacement holds the node out
    assert {"cordon", "drain", "migrate", "inspect", "reboot_node", "hardware_replacement"} == (
        actions.TAKES_OUT_OF_SERVICE
    )
    assert {k for k, a in actions.CATALOG.items() if a.actuator is actions.Actuator.GPU} == {
        "reset_gpu",
        "reset_port",
        "validate",
    }
    assert set(actions.CATALOG) - set(actions.RULE_KINDS) == {
        "validate", "reset_port", "reboot_node", "return_to_service", "hardware_replacement",
    }  # fmt: skip
    with pytest.raises(ValueError, match="recovery-ladder step"):
        actions.build("reboot_node", None)
    assert {k for k, a in actions.CATALOG.items() if a.per_node_cooldown} == {"power_limit"}
    assert {k for k, a in actions.CATALOG.items() if a.actuator is actions.Actuator.POWER} == {
        "power_limit",
        "restore_power_limit",
    }


# -- correlation: one incident per fault ------------------------------------------------------------
DBE = ruleset.Rule(
    id="ecc-dbe-new", severity="major", scope=fields.Scope.GPU, description="new DBE",
    labels={"category": "memory"},
    actions=(actions.build("cordon", None), actions.build("migrate", None)),
)  # fmt: skip
XID = ruleset.Rule(
    id="xid-fatal", severity="critical", scope=fields.Scope.GPU,
    on_event=ruleset.EventMatch("xid", frozenset({48})),
    resolve_for_s=3600, has_resolve=True, labels={"category": "xid"},
    actions=(actions.build("cordon", {"reason": "xid"}), actions.build("migrate", None),
             actions.build("inspect", None)),
    on_resolve=(actions.build("uncordon", None),),
)  # fmt: skip
RESET = ruleset.Rule(
    id="recovery-action-reset", severity="major", scope=fields.Scope.GPU,
    actions=(actions.build("drain", None), actions.build("reset_gpu", {"when_idle": False})),
    on_resolve=(actions.build("uncordon", None), actions.build("restore_power_limit", None)),
)  # fmt: skip
MISSING = ruleset.Rule(
    id="gpu-missing", severity="critical", scope=fields.Scope.NODE, actions=(actions.build("cordon", None),)
)
APP = ruleset.Rule(
    id="xid-application", severity="info", scope=fields.Scope.GPU,
    on_event=ruleset.EventMatch("xid", frozenset({13})),
    actions=(actions.build("notify", None),),
)  # fmt: skip
RULES = {r.id: r for r in (DBE, XID, RESET, MISSING, APP, HOT)}


def fire(
    rule: ruleset.Rule, gpu: int | None = 1, status: Any = "fired", node: str = "n1", uuid: str | None = None,
    **evidence: Any,
) -> engine.Firing:  # fmt: skip
    return engine.Firing(rule, node, gpu, status, 100.0, 100.0, evidence or {rule.id: 1}, uuid)


def opened(rule: ruleset.Rule = DBE, gpu: int | None = 1, at: float = 100.0, **kw: Any) -> book.Incident:
    return decide.new_incident(
        fire(rule, gpu, **kw), f"inc-{rule.id}", at, incidents.Mode.ENFORCE, 1, SETTINGS
    )


def joined(inc: book.Incident, f: engine.Firing, now: float = 102.0) -> book.Incident:
    assert correlation.correlate(f, [inc], now, 120.0) is inc
    incident_shell.apply_join(inc, correlation.join(inc, f, now))
    return inc


def test_a_second_rule_on_the_same_gpu_within_the_window_joins_its_incident() -> None:
    inc = opened()
    assert correlation.correlate(fire(XID), [inc], 219.0, 120.0) is inc
    assert correlation.correlate(fire(XID), [inc], 220.0, 120.0) is None, (
        "outside the window: its own incident"
    )
    assert correlation.correlate(fire(XID, gpu=2), [inc], 101.0, 120.0) is None, "another GPU"
    assert correlation.correlate(fire(XID, node="n2"), [inc], 101.0, 120.0) is None, "another node"
    assert correlation.correlate(fire(XID), [inc], 101.0, 0.0) is None, "a window of 0 turns it off"
    resolved = opened().model_copy(update={"state": incidents.IncidentState.RESOLVED})
    assert correlation.correlate(fire(XID), [resolved], 101.0, 120.0) is None


def test_the_gpu_uuid_decides_where_both_are_known() -> None:
    inc = opened(uuid="GPU-a")
    assert correlation.correlate(fire(XID, gpu=1, uuid="GPU-b"), [inc], 101.0, 120.0) is None
    assert correlation.correlate(fire(XID, gpu=3, uuid="GPU-a"), [inc], 101.0, 120.0) is inc
    assert correlation.correlate(fire(XID, gpu=1), [inc], 101.0, 120.0) is inc, "no UUID: the index"


def test_a_node_scope_signal_joins_the_nodes_only_recent_incident() -> None:
    one, other = opened(gpu=1), opened(XID, gpu=2)
    assert correlation.correlate(fire(MISSING, gpu=None), [one], 101.0, 120.0) is one
    assert correlation.correlate(fire(MISSING, gpu=None), [one, other], 101.0, 120.0) is None, "which fault?"
    old = opened(XID, gpu=2, at=-100.0)
    assert correlation.correlate(fire(MISSING, gpu=None), [one, old], 101.0, 120.0) is one, (
        "only recent ones count"
    )


def test_a_gpu_signal_joins_a_gpu_less_incident_and_gives_it_its_gpu() -> None:
    missing = opened(MISSING, gpu=None)
    assert correlation.correlate(fire(XID, gpu=4, uuid="GPU-d"), [missing], 101.0, 120.0) is missing
    j = correlation.join(missing, fire(XID, gpu=4, uuid="GPU-d"), 101.0)
    assert j.gpu == (4, "GPU-d")
    incident_shell.apply_join(missing, j)
    assert (missing.gpu_index, missing.gpu_uuid) == (4, "GPU-d")
    assert missing.key == ("gpu-missing", "n1", None, None), "still found by the signal that opened it"
    assert missing.summary.endswith("joined by xid-fatal (GPU 4)")
    two = [opened(MISSING, gpu=None), opened(DBE, gpu=None)]
    assert correlation.correlate(fire(XID, gpu=4), two, 101.0, 120.0) is None


def test_a_joined_incident_has_the_highest_severity_every_signal_and_each_action_once() -> None:
    inc = joined(opened(DBE, xid=0, ecc_dbe_volatile=1), fire(XID, xid=48))
    assert inc.severity == "critical"
    assert [(a.kind, a.params) for a in inc.actions] == [
        ("cordon", {"reason": "xid"}), ("migrate", {}), ("inspect", {}),
    ], "cordon and migrate once; the joining rule's reason fills the missing one; inspect added"  # fmt: skip
    assert inc.evidence == {
        "xid": 0, "ecc_dbe_volatile": 1, "signals": "ecc-dbe-new,xid-fatal", "xid-fatal.xid": 48,
    }  # fmt: skip
    assert inc.summary.endswith("; joined by xid-fatal")
    assert inc.labels == {"category": "memory"}, "the first rule's labels win"
    assert [s.rule_id for s in inc.signals] == ["ecc-dbe-new", "xid-fatal"]
    assert inc.keys == [("ecc-dbe-new", "n1", 1, None), ("xid-fatal", "n1", 1, None)]


def test_actions_already_carried_out_are_kept_and_pending_ones_take_the_stronger_parameters() -> None:
    inc = opened(XID)
    inc.actions[0].status = incidents.ActionStatus.DONE
    cordon = inc.actions[0]
    joined(inc, fire(RESET))
    assert inc.actions[0] is cordon, "the same object: an action task may be running it"
    assert [a.kind for a in inc.actions] == ["cordon", "migrate", "inspect", "drain", "reset_gpu"]
    assert inc.actions[-1].params == {"when_idle": False}
    capped = opened(HOT, gpu=1)
    stronger = dataclasses.replace(
        HOT, id="hotter", actions=(actions.build("power_limit", {"percent_of_default": 60}),)
    )
    joined(capped, fire(stronger))
    assert [(a.kind, a.params) for a in capped.actions] == [("power_limit", {"percent_of_default": 60})]


def test_stronger_parameters() -> None:
    assert correlation.stronger("power_limit", {"watts": 300}, {"watts": 250}) == {"watts": 250}
    assert correlation.stronger("power_limit", {"watts": 300}, {"percent_of_default": 50}) == {"watts": 300}
    assert correlation.stronger("reset_gpu", {"when_idle": True}, {"when_idle": False}) == {
        "when_idle": False
    }
    assert correlation.stronger("cordon", {"reason": "a"}, {"reason": "b"}) == {"reason": "a"}
    assert correlation.stronger("cordon", {}, {"reason": "b"}) == {"reason": "b"}


def test_a_joined_incident_resolves_when_its_last_signal_does_with_every_rules_on_resolve_once() -> None:
    inc = joined(joined(opened(XID), fire(RESET)), fire(DBE))
    part = decide.on_firing(fire(XID, status="resolved"), inc, RULES.get)
    assert part.change is decide.Change.PART, "the reset and the DBE still hold it"
    inc.signals[0].resolved_at = 200.0
    assert decide.on_firing(fire(RESET, status="resolved"), inc, RULES.get).change is decide.Change.PART
    inc.signals[1].resolved_at = 201.0
    done = decide.on_firing(fire(DBE, status="resolved"), inc, RULES.get)
    assert done.change is decide.Change.RESOLVE
    assert [(a.kind, a.on_resolve) for a in done.on_resolve] == [
        ("uncordon", True), ("restore_power_limit", True),
    ]  # fmt: skip
    gone = decide.on_firing(fire(DBE, status="resolved", reason=engine.FORGOTTEN), inc, RULES.get)
    assert gone.on_resolve == ()


def test_a_signal_of_a_rule_that_never_resolves_is_evidence_only() -> None:
    inc = joined(opened(DBE), fire(APP, xid=13))
    assert not inc.signals[1].holds
    assert decide.on_firing(fire(DBE, status="resolved"), inc, RULES.get).change is decide.Change.RESOLVE
    again = decide.on_firing(fire(APP, xid=13), inc, RULES.get)
    assert again.change is decide.Change.REFRESH, "another XID 13 refreshes the joined incident"


def test_an_incident_stored_before_signals_existed_has_its_own_rules() -> None:
    doc = opened().model_dump(mode="json")
    del doc["signals"]
    old = book.Incident.model_validate(doc)
    assert [(s.rule_id, s.gpu_index, s.since) for s in old.signals] == [("ecc-dbe-new", 1, 100.0)]
    inc = joined(opened(), fire(XID))
    again = book.Incident.model_validate(inc.model_dump(mode="json"))
    assert again.keys == inc.keys
    assert correlation.evidence_of(again) == inc.evidence


async def test_the_book_finds_a_joined_incident_by_every_signal_and_forgets_all_when_it_resolves() -> None:
    from healer.bus import memory
    from healer.controller.store import kv

    store = kv.Store(memory.MemoryBus().add_bucket("state"))
    b = book.Book(store)
    inc = joined(opened(), fire(XID))
    await b.save(inc)
    assert b.get(("ecc-dbe-new", "n1", 1, None)) is inc
    assert b.get(("xid-fatal", "n1", 1, None)) is inc
    assert list(b.open.values()) == [inc]
    assert b.by_severity()["critical"] == 1
    restarted = book.Book(store)
    await restarted.load()
    assert restarted.get(("xid-fatal", "n1", 1, None)) is not None, "the join is kept in KV"
    inc.state = incidents.IncidentState.RESOLVED
    await b.save(inc)
    assert b.get(("ecc-dbe-new", "n1", 1, None)) is None
    assert b.get(("xid-fatal", "n1", 1, None)) is None
