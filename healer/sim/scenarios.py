"""Scenario files: which GPUs the fleet has, what runs on it, and which faults to inject when.

A scenario is a YAML file (schema below, documented in docs/simulator.md); the built-in ones (``healthy``,
``overheat``, ``ecc``, ``nvlink``, ``pcie``, ``fell-off-bus``, ``mixed``, ``realistic``, ``fabric``,
``failslow``) ship as package data in ``healer/sim/scenarios/``. ``load`` accepts a built-in name or a
path; ``build`` turns a scenario plus fleet size and seed into a ready ``simulation.Simulation``. Everything
random is drawn from generators spawned from the one seed, so the same seed gives the same fleet, faults
and telemetry.
"""

from __future__ import annotations

import importlib.resources
import pathlib
import time
import uuid
from typing import Any, Literal

import numpy as np
import pydantic
import yaml

from healer import errors
from healer.schemas import telemetry
from healer.sim import (
    faults,
    frames,
    hca,
    injector,
    physics,
    profiles,
    simulation,
    step_reports,
    variation,
    workloads,
)

WorkloadKind = Literal["training", "inference", "idle"]

DEFAULT_START_TS = 1_767_225_600.0
"""2026-01-01T00:00:00Z: where recorded runs start unless told otherwise (keeps them reproducible)."""


class _Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class FaultEntry(_Model):
    kind: str
    """A fault kind (faults.KINDS)."""
    at_s: float | tuple[float, float] = pydantic.Field(default=60.0)
    """Start, in seconds after the run starts, or a ``[min, max]`` range drawn per target."""
    nodes: int | list[int] = 1
    """How many distinct nodes (drawn at random, each entry on nodes no earlier entry used while any
    remain), or an explicit list of node indices."""
    gpu: int | Literal["random", "all"] = "random"
    """Which GPU of each node (ignored by node-scope kinds): an index, one at random, or every GPU."""
    params: dict[str, float | tuple[float, float]] = pydantic.Field(default_factory=dict)
    """Kind parameters; unknown names are errors (defaults in docs/simulator.md). A ``[min, max]``
    range is drawn per target."""

    @pydantic.model_validator(mode="after")
    def _known(self) -> FaultEntry:
        faults.validate_params(
            self.kind, {k: v if isinstance(v, int | float) else v[0] for k, v in self.params.items()}
        )
        return self


class RandomEntry(_Model):
    kind: str
    rate_per_gpu_hour: float = pydantic.Field(ge=0)
    """Expected faults of this kind per GPU-hour of the fleet (before the multiplier)."""
    params: dict[str, float] = pydantic.Field(default_factory=dict)

    @pydantic.model_validator(mode="after")
    def _known(self) -> RandomEntry:
        faults.validate_params(self.kind, self.params)
        return self


VariationBlock = variation.Variation
"""(An alias: inside ``Scenario`` the field ``variation`` hides the module.)"""


def _default_mix() -> dict[WorkloadKind, float]:
    return {"training": 0.6, "inference": 0.3, "idle": 0.1}


class Scenario(_Model):
    name: str
    description: str = ""
    models: dict[str, float] = pydantic.Field(default_factory=lambda: {"H100": 1.0})
    """GPU model mix by profile key (H100, H200, A100), one model per node."""
    inlet_c: float = 25.0
    """Mean node inlet temperature."""
    inlet_spread_c: float = pydantic.Field(default=2.0, ge=0)
    """Node inlets are uniform within inlet_c ± this."""
    workload: dict[WorkloadKind, float] = pydantic.Field(default_factory=_default_mix)
    """Job mix: the weight of each kind when a node gets its next job."""
    faults: list[FaultEntry] = pydantic.Field(default_factory=list)
    random_faults: list[RandomEntry] = pydantic.Field(default_factory=list)
    fault_rate_multiplier: float = pydantic.Field(default=1.0, ge=0)
    variation: VariationBlock = pydantic.Field(default_factory=VariationBlock)
    """How unlike a tidy fleet this one is (healer/sim/variation.py; all off by default)."""
    ports: int = pydantic.Field(default=0, ge=0, le=16)
    """RDMA ports per node (InfiniBand NDR, 400 Gb/s; sim/hca.py); 0: frames carry none (v1)."""
    job_nodes: int | tuple[int, int] = 1
    """Nodes per job (#28): consecutive nodes form gangs of this many (a ``[min, max]`` range: drawn per
    gang) that run one job together (same kind, start, end, checkpoints and iteration phase), so a
    fail-slow fault on one node slows the job on all of them; 1: every node runs its own jobs."""
    job_nodes_exponent: float = pydantic.Field(default=0.0, ge=0)
    """How a ``job_nodes`` range is drawn: a gang of ``n`` nodes with probability in proportion to
    ``n ** -job_nodes_exponent``. 0: uniform (the default); 1: as many gangs of each doubling of size
    (1, 2-3, 4-7, ...); 2: about as many *nodes* in each doubling, many small jobs and a few large."""
    steps: bool = False
    """Training jobs' ranks report their step times (#28, sim/step_reports.py): ``healer sim`` publishes
    them on ``healer.steps.<job>`` as a job's ``healer.steps.StepReporter`` would."""
    rack_size: int = pydantic.Field(default=0, ge=0)
    """Nodes per rack, in index order (racks ``r0``, ``r1``, ...): the failure-domain label ``rack`` that
    ``healer demo`` writes into the controller's inventory (#27); 0: no racks."""

    @pydantic.field_validator("job_nodes")
    @classmethod
    def _job_nodes(cls, v: int | tuple[int, int]) -> int | tuple[int, int]:
        lo, hi = (v, v) if isinstance(v, int) else v
        if not 1 <= lo <= hi:
            raise ValueError(f"job_nodes: want 1 <= min <= max, got {v}")
        return v

    @pydantic.field_validator("models")
    @classmethod
    def _models_known(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = set(v) - set(profiles.PROFILES)
        if unknown:
            raise ValueError(f"unknown GPU models {sorted(unknown)} (known: {sorted(profiles.PROFILES)})")
        if sum(v.values()) <= 0:
            raise ValueError("models: weights must add up to more than 0")
        return v


def builtin_names() -> list[str]:
    root = importlib.resources.files("healer.sim") / "scenarios"
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def builtin_text(name: str) -> str:
    return (importlib.resources.files("healer.sim") / "scenarios" / f"{name}.yaml").read_text()


def parse(text: str, origin: str = "<string>") -> Scenario:
    """A Scenario from YAML text; errors.PermanentError says what is wrong and where."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise errors.PermanentError(f"scenario {origin}: not YAML: {e}") from e
    if not isinstance(doc, dict):
        raise errors.PermanentError(f"scenario {origin}: top level must be a mapping")
    try:
        return Scenario.model_validate(doc)
    except pydantic.ValidationError as e:
        raise errors.PermanentError(f"scenario {origin}: {e}") from e


def load(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a YAML file by path."""
    path = pathlib.Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        try:
            text = path.read_text()
        except OSError as e:
            raise errors.PermanentError(f"cannot read scenario {path}: {e}") from e
        return parse(text, str(path))
    if name_or_path not in builtin_names():
        raise errors.PermanentError(
            f"no scenario {name_or_path!r}: give a YAML file or one of {', '.join(builtin_names())}"
        )
    return parse(builtin_text(name_or_path), name_or_path)


def node_names(count: int, prefix: str = "sim") -> list[str]:
    return [f"{prefix}-{i:05d}" for i in range(count)]


def _schedule(
    sc: Scenario, nodes: int, gpus: int, start_ts: float, rng: np.random.Generator
) -> list[faults.Fault]:
    order = list(rng.permutation(nodes))
    cursor = 0
    out = []
    for entry in sc.faults:
        if isinstance(entry.nodes, list):
            bad = [n for n in entry.nodes if not 0 <= n < nodes]
            if bad:
                raise errors.PermanentError(
                    f"scenario {sc.name}: {entry.kind}: nodes {bad} not in 0..{nodes - 1}"
                )
            targets = list(entry.nodes)
        else:
            targets = []
            for _ in range(min(entry.nodes, nodes)):
                targets.append(int(order[cursor % nodes]))
                cursor += 1
        if entry.kind in faults.PORT_KINDS and not sc.ports:
            raise errors.PermanentError(
                f"scenario {sc.name}: {entry.kind} needs RDMA ports: set `ports:` (e.g. 8)"
            )
        node_scope = faults.KINDS[entry.kind].scope == "node"
        for node in targets:
            at = entry.at_s if isinstance(entry.at_s, float | int) else float(rng.uniform(*entry.at_s))
            drawn = {
                k: float(v) if isinstance(v, int | float) else float(rng.uniform(*v))
                for k, v in entry.params.items()
            }
            params = faults.validate_params(entry.kind, drawn)
            gpu_list: list[int | None]
            if node_scope:
                gpu_list = [None]
            elif entry.gpu == "all":
                gpu_list = list(range(gpus))
            elif entry.gpu == "random":
                gpu_list = [int(rng.integers(gpus))]
            else:
                gpu_list = [entry.gpu % gpus]
            for g in gpu_list:
                out.append(faults.Fault(entry.kind, node, g, start_ts + float(at), dict(params)))
    return out


def build(
    sc: Scenario,
    *,
    nodes: int,
    gpus: int = 8,
    seed: int = 0,
    start_ts: float | None = None,
    run_id: str | None = None,
    fault_rate_multiplier: float | None = None,
    names: list[str] | None = None,
    source: telemetry.Source = "sim",
) -> simulation.Simulation:
    """A ready simulation of ``nodes`` x ``gpus`` for scenario ``sc``.

    ``run_id`` goes into boot ids, GPU UUIDs and event ids; it defaults to one derived from the seed
    (reproducible); live runs pass a fresh one so JetStream does not deduplicate a rerun's events.
    """
    if nodes < 1 or gpus < 1:
        raise errors.PermanentError("a fleet needs at least one node with at least one GPU")
    start = DEFAULT_START_TS if start_ts is None else start_ts
    run = run_id or f"s{seed:x}"
    setup_ss, fleet_ss, fault_ss = np.random.SeedSequence([seed, 0x5EED]).spawn(3)
    setup_rng = np.random.default_rng(setup_ss)
    keys = list(sc.models)
    weights = np.array([sc.models[k] for k in keys], dtype=np.float64)
    picks = setup_rng.choice(len(keys), size=nodes, p=weights / weights.sum())
    vary = variation.draw(sc.variation, np.random.default_rng([seed, 0x7A42]))
    if vary.model_pools:
        pool_rng = np.random.default_rng([seed, 0x7A43])
        pool_pick = pool_rng.choice(len(keys), size=vary.model_pools, p=weights / weights.sum())
        picks = pool_pick[np.arange(nodes) * vary.model_pools // nodes]
    node_profiles = [profiles.PROFILES[keys[i]] for i in picks]
    names = names or node_names(nodes)
    gang = None
    if sc.job_nodes != 1:
        lo, hi = (sc.job_nodes, sc.job_nodes) if isinstance(sc.job_nodes, int) else sc.job_nodes
        gang_rng = np.random.default_rng([seed, 0x70B5])
        gang = workloads.gangs(_gang_sizes(gang_rng, lo, hi, sc.job_nodes_exponent, nodes), nodes)
    fl = physics.Fleet(
        names,
        gpus,
        node_profiles,
        seed=int(fleet_ss.generate_state(1)[0]),
        start_ts=start,
        run_id=run,
        workload_mix={str(k): v for k, v in sc.workload.items()},
        inlet_c=sc.inlet_c,
        inlet_spread_c=sc.inlet_spread_c,
        vary=vary,
        gang=gang,
    )
    if sc.ports:
        fl.ports = hca.Ports(nodes, sc.ports, np.random.default_rng([seed, 0x9047]))
    scheduled = _schedule(sc, nodes, gpus, start, setup_rng)
    specs = [
        injector.RandomSpec(e.kind, e.rate_per_gpu_hour, faults.validate_params(e.kind, e.params))
        for e in sc.random_faults
    ]
    multiplier = sc.fault_rate_multiplier if fault_rate_multiplier is None else fault_rate_multiplier
    inj = injector.Injector(fl, scheduled, specs, multiplier=multiplier, rng=np.random.default_rng(fault_ss))
    encoder = frames.Encoder(
        names, frames.static_fields(fl.profiles, fl.uuids), source=source, job_prefix=run
    )
    steps = step_reports.StepSource(fl, run, seed) if sc.steps else None
    return simulation.Simulation(fl, inj, encoder, steps)


def _gang_sizes(rng: np.random.Generator, lo: int, hi: int, exponent: float, nodes: int) -> list[int]:
    """``nodes`` gang sizes in ``[lo, hi]`` (``workloads.gangs`` uses as many as fill the fleet), each
    size ``n`` with probability in proportion to ``n ** -exponent`` (0: uniform, drawn as before)."""
    if exponent == 0:
        return [int(x) for x in rng.integers(lo, hi + 1, nodes)]
    sizes = np.arange(lo, hi + 1, dtype=np.float64)
    weights = sizes**-exponent
    return [int(x) for x in rng.choice(sizes, size=nodes, p=weights / weights.sum())]


def fresh_run_id() -> str:
    """A run id for live runs: unique, short."""
    return f"r{int(time.time()) % 100000:05d}{uuid.uuid4().hex[:6]}"


def describe(sc: Scenario) -> dict[str, Any]:
    return sc.model_dump(mode="json")
