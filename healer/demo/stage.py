"""Setting the demo's stage: the rules the controller runs, the scenario and the simulated fleet.

The controller runs the **default rule pack** (``rules/`` of the checkout, or ``--rules DIR``) with the
rules of an override directory (``healer/demo/rules/`` by default) replacing the pack's rules of the same
id. The default override only shortens the timing of ``gpu-temp-near-slowdown`` (a GPU takes about two
minutes to heat past 85 C and cool under its cap again; the real rule then waits another five); every
other rule is the shipped one. The merged directory is written to the demo's temporary directory, so
nothing in the checkout changes.

The fleet is the simulator's (``healer.sim``), running a scenario file (``healer/demo/scenario.yaml`` by
default, same format as ``healer sim``). Before the demo starts the fleet is stepped for a few simulated
minutes so its GPUs are at working temperature; the scenario's ``at_s`` count from the end of that warm-up.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import pathlib
import shutil
from collections.abc import Sequence

import numpy as np
import yaml

from healer import config, errors
from healer.sim import faults, scenarios, simulation, workloads


class SetupError(errors.PermanentError):
    """A demo option to fix before anything starts (``healer demo`` exits 2): a fleet too small for the
    scenario, a rule pack that does not load. The message names the option."""


WARMUP_S = 300.0
"""Simulated seconds the fleet runs before the demo starts (thermal time constants are ~30 s)."""
POWER_RACK = "r6"
"""The power story's rack in the default demo (#30): nodes 24-27, idle until their 4-node training job
starts (``POWER_START``), which takes the rack over its budget (``POWER_BUDGET_FRACTION`` of what its
GPUs draw at full load); healer caps it, and restores it once the job ends (``POWER_END``)."""
POWER_START = 0.1
"""The power story's jobs start at this share of the demo's duration (15 s of 150 s) ..."""
POWER_END = 0.45
"""... and end at this share (67.5 s of 150 s), before the mass fault."""
POWER_BUDGET_FRACTION = 0.8
TRAINING_UTIL = 0.95
"""A training job's utilisation in the simulator (workloads: ~95 % on every GPU)."""


def default_scenario_text() -> str:
    return (importlib.resources.files("healer.demo") / "scenario.yaml").read_text()


def default_overrides() -> pathlib.Path:
    return pathlib.Path(str(importlib.resources.files("healer.demo") / "rules"))


def find_model(explicit: str | None = None) -> pathlib.Path | None:
    """The anomaly model the demo's controller scores with: ``explicit`` ("" = none), else
    ``models/default`` in the working directory or in the checkout this package lives in."""
    if explicit == "":
        return None
    if explicit:
        return pathlib.Path(explicit)
    for c in (
        pathlib.Path("models/default"),
        pathlib.Path(__file__).resolve().parents[2] / "models" / "default",
    ):
        if (c / "card.json").is_file():
            return c
    return None


def find_rule_pack(explicit: str | None = None) -> pathlib.Path:
    """``explicit``, else ``rules/`` in the working directory, else the checkout this package lives in."""
    candidates = (
        [pathlib.Path(explicit)]
        if explicit
        else [pathlib.Path("rules"), pathlib.Path(__file__).resolve().parents[2] / "rules"]
    )
    for c in candidates:
        if c.is_dir() and any(c.glob("*.yaml")):
            return c
    raise errors.PermanentError(
        f"no rule pack at {', '.join(str(c) for c in candidates)}: "
        "run from the healer checkout or give --rules"
    )


def _doc_of(path: pathlib.Path) -> dict[str, object]:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise errors.PermanentError(f"cannot read rule file {path}: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("rules", doc.get("ladders")), list):
        raise errors.PermanentError(f"{path}: expected a mapping with `rules:` (or `ladders:`)")
    return doc


def _rules_of(path: pathlib.Path) -> list[dict[str, object]]:
    rules = _doc_of(path).get("rules", [])
    return [r for r in rules if isinstance(r, dict)] if isinstance(rules, list) else []


def _ladders_of(path: pathlib.Path) -> list[dict[str, object]]:
    ladders = _doc_of(path).get("ladders") or []
    return [lad for lad in ladders if isinstance(lad, dict)] if isinstance(ladders, list) else []


def merge_rules(pack: pathlib.Path, overrides: pathlib.Path | None, out: pathlib.Path) -> list[str]:
    """Write ``pack`` to ``out`` with the rules (and ladders) of ``overrides`` replacing those of the
    same id.

    Files of the pack without an overridden rule or ladder are copied byte for byte; the others are
    rewritten without them, and the override files are added as ``zz-demo-<name>``. Returns the ids
    overridden. The controller's own loader then checks the result as it checks any rules directory.
    """
    out.mkdir(parents=True, exist_ok=True)
    override_files = sorted(overrides.glob("*.yaml")) if overrides is not None else []
    replaced = {str(r.get("id")) for f in override_files for r in _rules_of(f)}
    replaced |= {str(lad.get("id")) for f in override_files for lad in _ladders_of(f)}
    for f in sorted(pack.glob("*.yaml")):
        rules, ladders = _rules_of(f), _ladders_of(f)
        if any(str(r.get("id")) in replaced for r in [*rules, *ladders]):
            doc = {**_doc_of(f), "rules": [r for r in rules if str(r.get("id")) not in replaced]}
            if ladders:
                doc["ladders"] = [lad for lad in ladders if str(lad.get("id")) not in replaced]
            (out / f.name).write_text(yaml.safe_dump(doc, sort_keys=False))
        else:
            shutil.copyfile(f, out / f.name)
    for f in override_files:
        shutil.copyfile(f, out / f"zz-demo-{f.name}")
    return sorted(replaced)


def check_fleet(sc: scenarios.Scenario, nodes: int, gpus: int, seed: int) -> None:
    """``SetupError`` naming ``--nodes`` when the scenario names nodes past the fleet (the default
    scenario's story uses node indices up to 31, so it needs at least 32 nodes)."""
    try:
        scenarios.build(sc, nodes=nodes, gpus=gpus, seed=seed)
    except errors.PermanentError as e:
        named = [n for entry in sc.faults if isinstance(entry.nodes, list) for n in entry.nodes]
        least = max(named, default=-1) + 1
        hint = f"give --nodes {least} or more, or another --scenario" if least > nodes else "see --scenario"
        raise SetupError(f"--nodes {nodes}: {e}: {hint}") from e


def check_rule_pack(pack: pathlib.Path) -> None:
    """``SetupError`` listing every error against the user's own files (``--rules``), before the pack is
    merged into the demo's temporary copy."""
    from healer.rules import loader

    result = loader.load_paths([pack])
    if result.ruleset is None:
        raise SetupError(
            f"the rules in {pack} do not load (--rules; `healer rules check {pack}` lists every error):\n"
            + "\n".join(str(d) for d in result.errors)
        )


def load_scenario(path: str | None) -> scenarios.Scenario:
    if path is None:
        return scenarios.parse(default_scenario_text(), "healer/demo/scenario.yaml")
    return scenarios.load(path)


@dataclasses.dataclass(frozen=True, slots=True)
class PowerStory:
    """A rack with a power budget whose jobs ramp during the demo (#30): idle through the warm-up, its
    nodes start training at ``start_s`` (seconds into the demo) and stop at ``end_s``."""

    domain: str
    nodes: tuple[int, ...]
    names: frozenset[str]
    budget_w: float
    start_s: float
    end_s: float


def rack_nodes(sc: scenarios.Scenario, nodes: int, key: str, value: str) -> list[int]:
    """The indices of the demo's nodes whose inventory labels have ``key`` = ``value``."""
    inv = inventory(sc, nodes)
    return [i for i, labels in enumerate(inv.values()) if labels.get(key) == value]


def power_story(
    sc: scenarios.Scenario, cs: config.ControllerSettings, nodes: int, duration_s: float
) -> PowerStory | None:
    """The story of the first power budget that names a domain of the demo's inventory, if any."""
    names = scenarios.node_names(nodes)
    for b in cs.power_budgets:
        idx = rack_nodes(sc, nodes, b.key, b.value) if sc.rack_size else []
        if idx:
            return PowerStory(
                b.domain, tuple(idx), frozenset(names[i] for i in idx), b.gpu_budget_w,
                POWER_START * duration_s, POWER_END * duration_s,
            )  # fmt: skip
    return None


def full_load_w(sc: scenarios.Scenario, nodes: int, gpus: int, seed: int, idx: Sequence[int]) -> float:
    """What the GPUs of nodes ``idx`` draw training at full load (their datasheets in the simulator)."""
    fl = scenarios.build(sc, nodes=nodes, gpus=gpus, seed=seed).fleet
    rows = list(idx)
    return float(np.sum(fl.p_idle[rows] + (fl.p_full[rows] - fl.p_idle[rows]) * TRAINING_UTIL))


def start_jobs(sim: simulation.Simulation, story: PowerStory) -> None:
    """The story's rack gets its training job (one per gang of ``job_nodes``, else one a node)."""
    work = sim.fleet.work
    rows = list(story.nodes)
    if not isinstance(work, workloads.Workloads):
        return
    first = int(work.job_no.max()) + 1
    work.kind[rows] = workloads.TRAINING
    work.end_t[rows] = np.inf  # the story ends it
    if work.gang is None:
        work.job_no[rows] = first + np.arange(len(rows))
    else:
        work.job_no[rows] = first + np.searchsorted(np.unique(work.gang[rows]), work.gang[rows])


def end_jobs(sim: simulation.Simulation, story: PowerStory) -> None:
    """The story's jobs end (their own end, not healer's doing): the rack idles."""
    work = sim.fleet.work
    if isinstance(work, workloads.Workloads):
        rows = list(story.nodes)
        work.kind[rows] = workloads.IDLE
        work.job_no[rows] = -1


def build_fleet(
    sc: scenarios.Scenario,
    *,
    nodes: int,
    gpus: int,
    seed: int,
    start_ts: float,
    warmup_s: float = WARMUP_S,
    idle: Sequence[int] = (),
) -> simulation.Simulation:
    """The simulation, warmed up so that its clock reads ``start_ts`` and its first fault is still ahead.

    Each GPU that a ``cooling_degradation`` fault targets gets nominal cooling (the simulator otherwise
    draws every GPU's cooling within ±4 %): the story's timing (hot enough to fire, cool enough under an
    80 % cap to resolve) is tuned for nominal cooling and must not depend on the seed. Likewise the job a
    fail-slow fault slows does not checkpoint during the story (a checkpoint is no load: the straggler
    scorer would wait it out, past the demo's end). The ``idle`` nodes (the power story's rack) run no job
    through the warm-up, and will not checkpoint during the story either.
    """
    shifted = [
        f.model_copy(
            update={
                "at_s": f.at_s + warmup_s
                if isinstance(f.at_s, float | int)
                else (f.at_s[0] + warmup_s, f.at_s[1] + warmup_s)
            }
        )
        for f in sc.faults
    ]
    sim = scenarios.build(
        sc.model_copy(update={"faults": shifted}),
        nodes=nodes,
        gpus=gpus,
        seed=seed,
        start_ts=start_ts - warmup_s,
        run_id=scenarios.fresh_run_id(),
    )
    work = sim.fleet.work
    for _, _, fault in sim.injector.pending:
        if fault.kind == "cooling_degradation" and fault.gpu is not None:
            sim.fleet.cool_base[fault.node, fault.gpu] = 1.0
        if fault.kind in faults.FAIL_SLOW_KINDS and isinstance(work, workloads.Workloads):
            # the slowed job's last checkpoint ended as the demo starts: its next is half an hour away
            gang = [fault.node] if work.gang is None else np.flatnonzero(work.gang == work.gang[fault.node])
            work.ckpt_phase[gang] = (
                workloads.CHECKPOINT_LENGTH_S + 1.0 - warmup_s
            ) % workloads.CHECKPOINT_PERIOD_S
    if idle and isinstance(work, workloads.Workloads):
        rows = list(idle)
        work.kind[rows] = workloads.IDLE
        work.job_no[rows] = -1
        work.end_t[rows] = np.inf
        work.ckpt_phase[rows] = (
            workloads.CHECKPOINT_LENGTH_S + 1.0 - warmup_s
        ) % workloads.CHECKPOINT_PERIOD_S
    steps = int(warmup_s)
    for _ in range(steps):
        sim.step(warmup_s / steps if steps else 0.0)
    sim.take_truth()
    return sim


def inventory(sc: scenarios.Scenario, nodes: int) -> dict[str, dict[str, str]]:
    """The demo's inventory: every simulated node with its rack (``rack_size`` nodes a rack, in order)."""
    names = scenarios.node_names(nodes)
    return {n: ({"rack": f"r{i // sc.rack_size}"} if sc.rack_size else {}) for i, n in enumerate(names)}


def story_nodes(sim: simulation.Simulation) -> list[str]:
    """Node names of the scheduled faults, in order of their start (first appearance)."""
    names: list[str] = []
    for _, _, fault in sorted(sim.injector.pending, key=lambda p: (p[0], p[1])):
        name = sim.fleet.node_names[fault.node]
        if name not in names:
            names.append(name)
    return names
