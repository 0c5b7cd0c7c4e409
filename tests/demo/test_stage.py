"""The demo's stage: the merged rule pack and the scripted story, checked in simulated time.

The story test drives the demo scenario through the same rule engine the controller runs (the default
pack plus the demo's override), stepping the simulator one second at a time and applying the power cap
the way the agent would, so the timing the demo promises is checked without waiting for it.
"""

from __future__ import annotations

import collections
import pathlib

import pytest
import yaml

from healer.controller.failslow import detector, straggler_settings
from healer.demo import stage
from healer.rules import engine, loader
from healer.schemas import codec, events

PACK = pathlib.Path(__file__).resolve().parents[2] / "rules"


def test_merged_pack_replaces_only_the_overridden_rules(tmp_path: pathlib.Path) -> None:
    replaced = stage.merge_rules(PACK, stage.default_overrides(), tmp_path)
    assert replaced == ["gpu-temp-near-slowdown", "rdma-port-rate-below-peers", "reset-then-reboot"]
    merged = loader.load_paths([tmp_path])
    shipped = loader.load_paths([PACK])
    assert merged.ruleset is not None, merged.errors
    assert shipped.ruleset is not None
    assert sorted(r.id for r in merged.ruleset.rules) == sorted(r.id for r in shipped.ruleset.rules)
    override = next(r for r in merged.ruleset.rules if r.id == "gpu-temp-near-slowdown")
    original = next(r for r in shipped.ruleset.rules if r.id == "gpu-temp-near-slowdown")
    assert override.for_s == 10
    assert original.for_s == 60
    ladder = next(lad for lad in merged.ruleset.ladders if lad.id == "reset-then-reboot")
    assert ladder.soak_s == 20  # the demo's timing; the same rungs and rules as shipped
    shipped_ladder = next(lad for lad in shipped.ruleset.ladders if lad.id == "reset-then-reboot")
    assert (ladder.steps, ladder.rules) == (shipped_ladder.steps, shipped_ladder.rules)
    assert sorted(lad.id for lad in merged.ruleset.ladders) == sorted(
        lad.id for lad in shipped.ruleset.ladders
    )
    for f in PACK.glob("*.yaml"):
        if f.name not in ("thermal.yaml", "ladders.yaml", "fabric.yaml"):
            assert (tmp_path / f.name).read_bytes() == f.read_bytes()


def test_no_override_directory_gives_the_pack_unchanged(tmp_path: pathlib.Path) -> None:
    assert stage.merge_rules(PACK, None, tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in PACK.glob("*.yaml"))


def _play(seed: int, seconds: int, tmp: pathlib.Path) -> dict[str, list[tuple[str, str, int | None, float]]]:
    """Run the demo scenario for ``seconds``: rule transitions by rule id as (status, node, gpu, t)."""
    stage.merge_rules(PACK, stage.default_overrides(), tmp)
    merged = loader.load_paths([tmp])
    assert merged.ruleset is not None
    eng = engine.Engine(merged.ruleset, gpus_per_node=8, stale_after_s=300)
    t0 = 1_900_000_000.0
    sim = stage.build_fleet(stage.load_scenario(None), nodes=32, gpus=8, seed=seed, start_ts=t0)
    fl = sim.fleet
    seen: dict[str, list[tuple[str, str, int | None, float]]] = {}
    for _ in range(seconds):
        sim.step(1.0)
        for _, data in sim.frames():
            eng.ingest(codec.decode_frame(data), at=fl.t)
        for e in sim.take_events():
            eng.ingest_event(events.NodeEvent.model_validate(e))
        for f in eng.evaluate(fl.t):
            if f.status == "firing":
                continue
            seen.setdefault(f.rule.id, []).append((f.status, f.node, f.gpu, fl.t - t0))
            if f.rule.id == "gpu-temp-near-slowdown":  # what the power actuator + agent do
                node, gpu = fl.node_names.index(f.node), f.gpu
                assert gpu is not None
                fl.set_power_limit(node, gpu, 560.0 if f.status == "fired" else 700.0)
    return seen


@pytest.mark.parametrize("seed", [0, 1])
def test_demo_story_fits_in_the_default_duration(seed: int, tmp_path: pathlib.Path) -> None:
    seen = _play(seed, 150, tmp_path)
    hot = seen["gpu-temp-near-slowdown"]
    assert [s for s, *_ in hot][:2] == ["fired", "resolved"], hot
    assert hot[0][3] < 60, "the GPU must pass 85 C well within the first minute"
    assert hot[1][3] < 100, "the capped GPU must cool and resolve with time to spare"
    for rule in ("ecc-dbe-new", "xid-fatal", "nvlink-crc-storm", "node-silent"):
        assert rule in seen, f"{rule} never fired"
    cordon_nodes = {n for r in ("ecc-dbe-new", "nvlink-crc-storm", "node-silent") for _, n, _, _ in seen[r]}
    # 3 single-node cordons and rack r7's 4 nodes; the straggler's cordon (the fail-slow scorer, not
    # played here: tests/demo/test_demo_run.py) makes 8, the demo's breaker limit
    assert len(cordon_nodes) == 7
    before_mass = [t for r in ("nvlink-crc-storm", "node-silent") for _, _, _, t in seen[r]]
    assert max(before_mass) < 139, "the 7 cordons must come before the mass fault (t=140)"
    # rack r7's power loss: its 4 nodes' node-silent fire within the shared-cause window, one incident
    inventory = stage.inventory(stage.load_scenario(None), 32)
    rack = [t for _, n, _, t in seen["node-silent"] if inventory[n] == {"rack": "r7"}]
    assert len(rack) == 4, rack
    assert max(rack) - min(rack) < 60, rack
    mass = [x for x in seen["xid-fatal"] if x[3] >= 140]
    assert len({n for _, n, _, _ in mass}) == 8
    by_rack = collections.Counter(inventory[n]["rack"] for n in {n for _, n, _, _ in mass})
    assert max(by_rack.values()) < 3, f"the driver roll-out must not look like a rack's fault: {by_rack}"
    expected = {
        "gpu-temp-near-slowdown", "ecc-dbe-new", "xid-fatal", "row-remap-pending", "nvlink-crc-storm",
        "nvlink-replay-recovery", "node-silent", "recovery-action-reset", "rdma-port-rate-below-peers",
    }  # fmt: skip
    assert {n for _, n, _, _ in seen["rdma-port-rate-below-peers"]} == {"sim-00009"}, "the down-trained port"
    # the straggler's HW slowdown (a bad power stage) is a power warning too, after its 2 minutes
    assert {(n, g) for _, n, g, _ in seen["power-hw-slowdown-sustained"]} == {("sim-00022", 3)}
    expected.add("power-hw-slowdown-sustained")
    # The driver's recovery action (a reset) comes with the GSP timeouts and the row remap, nowhere else.
    faulted = {(n, g) for r in ("xid-fatal", "row-remap-pending") for _, n, g, _ in seen[r]}
    assert {(n, g) for _, n, g, _ in seen["recovery-action-reset"]} <= faulted
    assert set(seen) == expected, "no other rule of the pack may fire on the healthy part of the fleet"


def test_the_demo_admits_its_fleet_from_an_inventory_with_racks(tmp_path: pathlib.Path) -> None:
    from healer.demo import session

    s = session.settings_for(session.Options(), "nats://127.0.0.1:1", tmp_path / "rules", tmp_path)
    assert s.controller.admission == "file"
    assert s.controller.inventory_file is not None
    nodes = yaml.safe_load(pathlib.Path(s.controller.inventory_file).read_text())["nodes"]
    assert len(nodes) == 32
    assert nodes["sim-00000"] == {"rack": "r0"}
    assert nodes["sim-00031"] == {"rack": "r7"}
    assert (s.controller.breaker_max_nodes, s.controller.breaker_max_percent) == (8, 25.0)
    assert s.controller.straggler_window_s == session.STRAGGLER_WINDOW_S


def test_the_demo_controller_scores_with_the_default_model(tmp_path: pathlib.Path) -> None:
    from healer.demo import session

    s = session.settings_for(session.Options(), "nats://127.0.0.1:1", tmp_path / "rules", tmp_path)
    assert s.controller.model is not None
    assert (pathlib.Path(s.controller.model) / "card.json").is_file()
    none = session.settings_for(session.Options(model=""), "nats://127.0.0.1:1", tmp_path / "rules", tmp_path)
    assert none.controller.model is None


@pytest.mark.parametrize("seed", [0, 1])
def test_the_demo_straggler_is_named_before_the_mass_fault_and_no_other(seed: int) -> None:
    from healer.demo import session

    window = session.STRAGGLER_WINDOW_S
    fs = detector.FailSlow(straggler_settings.Settings(window_s=window, sample_every_s=window / 12))
    t0 = 1_900_000_000.0
    sim = stage.build_fleet(stage.load_scenario(None), nodes=32, gpus=8, seed=seed, start_ts=t0)
    named_at = None
    for _ in range(139):
        sim.step(1.0)
        for _, data in sim.frames():
            fs.observe(codec.decode_frame(data))
        fs.tick(sim.t)
        if fs.scorer.stragglers and named_at is None:
            named_at = sim.t - t0
    assert set(fs.scorer.stragglers) == {("sim-00022", 3)}
    assert named_at is not None
    assert named_at < 90, "named within about a minute of the fault (t=10)"
    (found,) = fs.scorer.stragglers.values()
    assert found.job == f"{sim.fleet.run_id}-j{sim.fleet.job[22, 3]}"
    assert {int(j) for j in sim.fleet.job[20:24].ravel()} == {int(sim.fleet.job[22, 3])}, "a 4-node job"
