"""Node-wide faults without NATS: a GPU rule with ``node_wide`` opens a GPU incident that the node's other
GPUs join; once half of them fired it is one node incident, with each GPU's evidence, a power cap for
each GPU that fired and a restore for each as it cools (``controller.decide``)."""

from __future__ import annotations

from typing import Any

from healer import actions, config
from healer.controller.core import incident_shell
from healer.controller.incidents import book, correlation, decide
from healer.rules import engine, loader, nodewide, ruleset
from healer.schemas import fields, incidents

SETTINGS = config.ControllerSettings()
HOT = ruleset.Rule(
    id="hot", severity="warning", scope=fields.Scope.GPU, description="too hot",
    actions=(actions.build("power_limit", {"percent_of_default": 80}),),
    on_resolve=(actions.build("restore_power_limit", None),),
    node_wide=ruleset.NodeWide("thermal", min_gpus=2, fraction=0.5, within_s=120.0),
)  # fmt: skip
HBM = ruleset.Rule(
    id="hbm", severity="major", scope=fields.Scope.GPU, description="hot memory",
    actions=(actions.build("power_limit", {"percent_of_default": 70}),),
    on_resolve=(actions.build("restore_power_limit", None),),
    node_wide=ruleset.NodeWide("thermal"),
)  # fmt: skip
SUSTAINED = ruleset.Rule(
    id="sustained", severity="major", scope=fields.Scope.GPU, description="throttling",
    actions=(actions.build("cordon", None),), on_resolve=(actions.build("uncordon", None),),
    node_wide=ruleset.NodeWide("thermal"),
)  # fmt: skip
PLAIN = ruleset.Rule(
    id="plain",
    severity="major",
    scope=fields.Scope.GPU,
    actions=(actions.build("power_limit", {"watts": 300}),),
)
RULES = {r.id: r for r in (HOT, HBM, SUSTAINED, PLAIN)}


def fire(rule: ruleset.Rule, gpu: int, status: Any = "fired", t: float = 100.0) -> engine.Firing:
    return engine.Firing(rule, "n1", gpu, status, t, t, {"temp_c": 80.0 + gpu}, f"GPU-{gpu}")


class Node:
    """A controller's book in miniature: what the shell does with decide's answers."""

    def __init__(self, gpus: int = 8) -> None:
        self.gpus = gpus
        self.incidents: list[book.Incident] = []

    def open(self) -> list[book.Incident]:
        return [i for i in self.incidents if i.state != "resolved"]

    def find(self, f: engine.Firing) -> book.Incident | None:
        return next((i for i in self.open() if f.key in i.keys), None)

    def handle(self, f: engine.Firing) -> decide.FiringChange:
        inc = self.find(f)
        change = decide.on_firing(f, inc, RULES.get)
        if change.change is decide.Change.OPEN:
            into = correlation.correlate(f, self.open(), f.at, 120.0)
            if into is not None:
                incident_shell.apply_join(into, correlation.join(into, f, f.at, self.gpus, RULES.get))
            else:
                self.incidents.append(
                    decide.new_incident(
                        f, f"inc-{len(self.incidents)}", f.at, incidents.Mode.ENFORCE, 1, SETTINGS
                    )
                )
            return change
        if inc is None:
            return change
        signal = inc.signal(f.key)
        assert signal is not None
        if change.change in (decide.Change.PART, decide.Change.RESOLVE):
            signal.resolved_at = f.at
            inc.actions += change.on_resolve
        if change.change is decide.Change.RESOLVE:
            inc.state = incidents.IncidentState.RESOLVED
        if change.change is decide.Change.REFRESH:
            signal.resolved_at = None
            inc.actions += change.actions
        inc.evidence = correlation.evidence_of(inc)
        return change


def plan(inc: book.Incident) -> list[tuple[str, int | None]]:
    return [(a.kind, a.gpu_index) for a in inc.actions]


def test_gpus_firing_seconds_apart_end_as_one_node_incident_with_a_cap_for_each() -> None:
    node = Node()
    for gpu in range(8):
        node.handle(fire(HOT, gpu, t=100.0 + 3 * gpu))
    [inc] = node.incidents
    assert inc.node_wide_at == 109.0, "node-wide once the 4th of 8 GPUs fired"
    assert inc.gpu_index is None, "the node's incident, no longer GPU 0's"
    assert inc.gpu_uuid is None
    assert inc.node_gpus == 8
    assert plan(inc) == [("power_limit", g) for g in range(8)], "each GPU that fired is capped, once"
    assert inc.evidence["gpus"] == "0,1,2,3,4,5,6,7"
    assert inc.evidence["gpu5.temp_c"] == 85.0, "per-GPU evidence"
    assert "node-wide, 8 of 8 GPUs" in inc.summary
    assert "too hot" in inc.summary


def test_one_gpu_stays_a_gpu_incident_and_a_second_joins_it_without_making_it_node_wide() -> None:
    node = Node()
    node.handle(fire(HOT, 2))
    [inc] = node.incidents
    assert inc.gpu_index == 2
    assert inc.node_wide_at is None
    assert plan(inc) == [("power_limit", 2)]
    node.handle(fire(HOT, 5, t=110.0))
    assert len(node.incidents) == 1
    assert inc.gpu_index == 2, "2 of 8 is not half the node"
    assert inc.node_wide_at is None
    assert plan(inc) == [("power_limit", 2), ("power_limit", 5)]


def test_a_gpu_firing_after_the_window_opens_its_own_unless_the_node_went_node_wide() -> None:
    node = Node()
    node.handle(fire(HOT, 0))
    node.handle(fire(HOT, 1, t=300.0))
    assert len(node.incidents) == 2, "long after, not together: another fault"
    wide = Node(gpus=4)
    for gpu in range(2):
        wide.handle(fire(HOT, gpu))
    wide.handle(fire(HOT, 3, t=2000.0))
    [inc] = wide.incidents
    assert inc.node_wide_at == 100.0
    firing = inc.evidence["gpus_firing"]
    assert isinstance(firing, str)
    assert "3" in firing.split(","), "a node-wide fault takes later GPUs"


def test_each_gpu_is_restored_as_it_cools_and_the_incident_ends_with_the_last() -> None:
    node = Node()
    for gpu in range(4):
        node.handle(fire(HOT, gpu))
    [inc] = node.incidents
    change = node.handle(fire(HOT, 1, "resolved", t=400.0))
    assert change.change is decide.Change.PART
    assert [(a.kind, a.gpu_index) for a in change.on_resolve] == [("restore_power_limit", 1)]
    assert inc.evidence["gpus_firing"] == "0,2,3"
    again = node.handle(fire(HOT, 1, t=500.0))
    assert again.change is decide.Change.REFRESH
    assert [(a.kind, a.gpu_index) for a in again.actions] == [("power_limit", 1)], "hot again: capped again"
    for gpu in (0, 1, 2):
        node.handle(fire(HOT, gpu, "resolved", t=600.0))
    end = node.handle(fire(HOT, 3, "resolved", t=700.0))
    assert end.change is decide.Change.RESOLVE
    assert inc.state == "resolved"
    restores = [a.gpu_index for a in inc.actions if a.kind == "restore_power_limit"]
    assert sorted(g for g in restores if g is not None) == [0, 1, 1, 2, 3], (
        "every cap undone on its own GPU, none twice"
    )
    assert None not in restores, "a node-wide restore would undo every GPU's cap at once"


def test_correlated_rules_count_together_and_node_level_actions_run_once() -> None:
    node = Node()
    node.handle(fire(HOT, 0))
    node.handle(fire(HOT, 1))
    node.handle(fire(HBM, 2))
    node.handle(fire(HBM, 0))
    node.handle(fire(SUSTAINED, 3))
    node.handle(fire(SUSTAINED, 1))
    [inc] = node.incidents
    assert inc.node_wide_at is not None
    assert inc.severity == "major"
    assert plan(inc) == [("power_limit", 0), ("power_limit", 1), ("power_limit", 2), ("cordon", None)]
    assert [a.params for a in inc.actions if a.gpu_index == 0] == [{"percent_of_default": 70}], (
        "the stronger cap"
    )
    assert inc.evidence["gpu2.hbm.temp_c"] == 82.0
    for gpu, rule in ((0, HOT), (1, HOT), (2, HBM), (0, HBM), (3, SUSTAINED)):
        node.handle(fire(rule, gpu, "resolved", t=900.0))
    node.handle(fire(SUSTAINED, 1, "resolved", t=900.0))
    on_resolve = [(a.kind, a.gpu_index) for a in inc.actions if a.on_resolve]
    assert sorted(on_resolve, key=str) == sorted(
        [
            ("restore_power_limit", 0),
            ("restore_power_limit", 1),
            ("restore_power_limit", 2),
            ("uncordon", None),
        ],
        key=str,
    )


def test_a_rule_without_node_wide_keeps_one_incident_per_gpu() -> None:
    node = Node()
    for gpu in range(8):
        node.handle(fire(PLAIN, gpu))
    assert len(node.incidents) == 8
    assert all(a.gpu_index is None for i in node.incidents for a in i.actions), "the incident's own GPU"


def test_a_node_wide_threshold_is_a_share_of_the_node_and_never_one_gpu() -> None:
    nw = ruleset.NodeWide("g", min_gpus=2, fraction=0.5)
    assert [nw.threshold(n) for n in (1, 2, 4, 8, 16)] == [2, 2, 2, 4, 8]
    assert not nw.reached(1, 1), "a single GPU stays a GPU incident"
    assert ruleset.NodeWide("g", min_gpus=3, fraction=0.75).threshold(8) == 6


def test_node_wide_is_checked_at_load_with_its_position() -> None:
    bad = """rules:
  - id: r
    scope: node
    when: count(temp_c > 80) > 0
    severity: warning
    node_wide: {fraction: 0.5}
  - id: s
    when: temp_c > 80
    severity: warning
    node_wide: {min_gpus: 1, fraction: 1.5, within: 0s, grup: x}
"""
    result = loader.load_text(bad, "t.yaml")
    got = sorted((d.line, d.col, d.message) for d in result.errors)
    assert (6, 16, "node_wide groups GPU firings into a node incident: it needs scope gpu") in got
    assert any(line == 10 and "min_gpus" in m for line, _, m in got)
    assert any(line == 10 and "fraction" in m for line, _, m in got)
    assert any(line == 10 and "unknown field 'node_wide.grup'" in m for line, _, m in got)
    ok = loader.load_text(
        bad.replace("scope: node\n    when: count(temp_c > 80) > 0", "when: temp_c > 90").replace(
            "min_gpus: 1, fraction: 1.5, within: 0s, grup: x", "group: heat, within: 5m"
        )
    )
    assert ok.ruleset is not None
    r, s = ok.ruleset.rules
    assert r.node_wide == ruleset.NodeWide("r", 2, 0.5, 120.0), "the group defaults to the rule's id"
    assert s.node_wide == ruleset.NodeWide("heat", 2, 0.5, 300.0)


def test_the_instant_view_collapses_a_node_wide_group_for_rule_tests() -> None:
    firings = [fire(HOT, g) for g in range(4)] + [fire(PLAIN, 5)]
    out = nodewide.collapse(firings, lambda node: 8)
    assert len(out) == 2
    group = out[0]
    assert isinstance(group, nodewide.NodeGroup)
    assert group.gpus == (0, 1, 2, 3)
    assert group.node_gpus == 8
    assert nodewide.collapse(firings[:3], lambda node: 8) == firings[:3], "3 of 8: each its own"
