"""The simulator's recovery model: every fault kind has a row, probabilities are probabilities, the
ladders it names exist in the default pack, and a simulated fleet keeps each GPU's fault history."""

from __future__ import annotations

import numpy as np

from healer.rules import loader
from healer.sim import faults, repair, scenarios


def test_every_fault_kind_has_a_recovery_row_with_its_reasoning() -> None:
    assert set(repair.MODEL) == set(faults.KINDS)
    for kind, row in repair.MODEL.items():
        assert 0.0 <= row.reset <= 1.0, kind
        assert 0.0 <= row.reboot <= 1.0, kind
        assert row.why, kind


def test_the_ladders_named_exist_in_the_default_pack() -> None:
    result = loader.load_paths(["rules"])
    assert result.ruleset is not None
    declared = {lad.id for lad in result.ruleset.ladders}
    named = {row.ladder for row in repair.MODEL.values() if row.ladder is not None}
    assert named <= declared


def test_replacement_only_kinds_are_never_fixed_and_a_lost_gpu_is_never_reset() -> None:
    rng = np.random.default_rng(1)
    assert repair.MODEL["row_remap_failure"].replacement_only
    assert not any(repair.fixed_by("row_remap_failure", r, rng) for r in ("reset_gpu", "reboot_node") * 50)
    assert not any(repair.fixed_by("fell_off_bus", "reset_gpu", rng) for _ in range(50))
    fixed = sum(repair.fixed_by("row_remap_pending", "reset_gpu", rng) for _ in range(1000))
    assert fixed > 950


def test_a_fleet_keeps_each_gpus_fault_history() -> None:
    sc = scenarios.parse(
        "name: h\nfaults:\n"
        "  - {kind: ecc_dbe, nodes: [0], gpu: 2, at_s: 10}\n"
        "  - {kind: gsp_timeout, nodes: [0], gpu: 2, at_s: 20}\n"
        "  - {kind: node_silent, nodes: [1], at_s: 30, params: {duration_s: 5}}\n"
    )
    sim = scenarios.build(sc, nodes=2, gpus=4, seed=3, start_ts=1000.0)
    for _ in range(40):
        sim.step(1.0)
    history = sim.fleet.fault_history
    assert [kind for _, kind in history[(0, 2)]] == ["ecc_dbe", "gsp_timeout"]
    assert [kind for _, kind in history[(1, None)]] == ["node_silent"]
    assert history[(0, 2)][0][0] == 1010.0
