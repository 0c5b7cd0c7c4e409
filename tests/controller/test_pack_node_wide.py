"""Every node-wide fault is one incident (#38): each GPU rule of the default pack either groups its
node's GPUs (``node_wide``) or this file says why a per-GPU incident is right for it; a node-wide power
brake is one node incident, and a straggler behind it joins it rather than opening beside it."""

from __future__ import annotations

import pathlib

from healer import config
from healer.controller.core import incident_shell
from healer.controller.incidents import book, correlation, decide
from healer.rules import engine, loader, ruleset
from healer.schemas import incidents

PACK = pathlib.Path(__file__).resolve().parents[2] / "rules"

PER_GPU = {
    "ecc-dbe-new": "a double-bit error is one GPU's memory; its own remap, reset and replacement follow",
    "row-remap-pending": "a row remap is one GPU's memory; it needs that GPU's reset",
    "row-remap-failure": "one GPU's remap table is exhausted: that GPU is replaced",
    "retired-pages-limit": "one GPU's retired pages: that GPU is replaced",
    "recovery-action-reset": "the driver names the GPU to reset; each GPU's reset is its own ladder",
    "xid-fatal": "an XID names its GPU, and the first one cordons the node; each GPU gets its own ladder",
    "xid-reset-required": "an XID names the GPU to reset; each GPU's reset is its own ladder",
    "xid-restart-vm": "an XID names its GPU; the VM restart is per passthrough GPU",
    "xid-nvlink5": "an XID names its GPU's link; a node's NVLink fault groups through the nvlink rules",
    "xid-power-mechanical": "XID 54 names one GPU's auxiliary power cable",
    "xid-application": "an application's XID names the GPU its process ran on",
    "xid-application-burst": "per process and GPU by design (pids), not a node's fault",
    "xid-page-retirement-event": "one GPU's memory page",
    "xid-driver-notice": "a notice about one GPU",
    "gpu-lost-event": "one GPU off the bus; many at once is gpus_missing, a node rule",
}
"""GPU rules whose per-GPU incident is right, and why (a node-level cause has ``node_wide`` instead)."""

NODE_CAUSES = {
    "power-hw-slowdown-sustained", "gpu-temp-near-slowdown", "gpu-thermal-slowdown-sustained",
    "hbm-over-max-temp", "ecc-sbe-rate-high", "nvlink-link-down", "nvlink-crc-storm",
    "nvlink-replay-recovery", "gpu-fabric-not-ready", "gpu-fabric-failed", "pcie-link-degraded",
    "pcie-replay-rate", "anomaly-score-high", "gpu-straggler",
}  # fmt: skip
"""Rules that can fire on most of a node's GPUs for one cause (power brake, HW slowdown, clocks,
thermal, error storms, the node's fabric and PCIe switches): they must group node-wide."""


def pack() -> ruleset.RuleSet:
    loaded = loader.load_paths([PACK]).ruleset
    assert loaded is not None
    return loaded


def test_every_gpu_rule_groups_node_wide_or_says_why_not() -> None:
    rules = {r.id: r for r in pack().rules}
    gpu_rules = {i for i, r in rules.items() if r.scope == "gpu"}
    ungrouped = {i for i in gpu_rules if rules[i].node_wide is None}
    assert ungrouped - PER_GPU.keys() == set(), "a GPU rule without node_wide and without a reason"
    assert NODE_CAUSES - gpu_rules == set(), "a node-cause rule left the pack or changed scope"
    assert {i for i in NODE_CAUSES if rules[i].node_wide is None} == set(), "a node cause without node_wide"
    assert PER_GPU.keys() - ungrouped == set(), "a reason for a rule that groups (or no longer exists)"


class Node:
    """A controller's book for one 8-GPU node, as the incident shell applies decide's answers."""

    def __init__(self, rules: ruleset.RuleSet) -> None:
        self.by_id = {r.id: r for r in rules.rules}
        self.incidents: list[book.Incident] = []

    def fire(self, rule_id: str, gpu: int, at: float) -> None:
        f = engine.Firing(self.by_id[rule_id], "n1", gpu, engine.Status.FIRED, at, at, {}, f"GPU-{gpu}")
        open_ = [i for i in self.incidents if i.state != "resolved"]
        into = correlation.correlate(f, open_, at, 120.0)
        if into is not None:
            incident_shell.apply_join(into, correlation.join(into, f, at, 8, self.by_id.get))
        else:
            settings = config.ControllerSettings()
            self.incidents.append(
                decide.new_incident(f, f"inc-{len(self.incidents)}", at, incidents.Mode.ENFORCE, 1, settings)
            )


def test_a_node_wide_power_brake_is_one_incident_and_a_straggler_behind_it_joins_it() -> None:
    node = Node(pack())
    for gpu in range(7):  # the power brake holds 7 of 8 GPUs' clocks down
        node.fire("power-hw-slowdown-sustained", gpu, 1000.0 + gpu)
    assert len(node.incidents) == 1
    assert node.incidents[0].node_wide_at is not None, "node-wide"
    node.fire("gpu-straggler", 3, 1300.0)  # long after: its GPU lags its job's peers, the brake explains it
    assert len(node.incidents) == 1, "the straggler joined the power incident"
    assert {s.rule_id for s in node.incidents[0].signals} == {"power-hw-slowdown-sustained", "gpu-straggler"}


def test_a_straggler_on_a_node_without_a_node_wide_cause_opens_its_own() -> None:
    node = Node(pack())
    node.fire("power-hw-slowdown-sustained", 0, 1000.0)  # one GPU only: not node-wide, not the cause
    node.fire("gpu-straggler", 5, 1300.0)
    assert len(node.incidents) == 2
