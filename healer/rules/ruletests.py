"""``healer rules test``: promtool-style unit tests for rule files, driving the real Engine.

A test file names rule files (relative to itself), a sampling interval, and cases. Each case describes
nodes (GPU count, model, series per GPU in promtool notation, RDMA ports and series per port, node
events) and expectations: at a time, exactly which rules are firing where, optionally with their
actions and severity, and (``incidents:``) how they group into incidents: a ``node_wide`` group on
enough of a node's GPUs is one node incident ``{rule, node, gpus}`` (healer.rules.nodewide), every
other firing its own (a port-scope rule's ``{rule, node, port}``). Unspecified metrics
read as a healthy GPU of the node's model (baseline.py). Frames are built as ``NodeFrame`` objects and
go through ``Engine.ingest`` / ``evaluate`` exactly as in the controller.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import pydantic
import yaml

from healer import durations
from healer.rules import baseline, engine, loader, metric_catalog, nodewide, series
from healer.schemas import events, fabric, telemetry

T0 = 1_700_000_000.0
"""Unix time of t=0 in a test (any positive instant would do)."""


class _M(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")


class EventIn(_M):
    at: str | float
    kind: events.EventKind = "xid"
    gpu: int | None = None
    xid: int | None = None
    pid: int | None = None
    details: dict[str, str | int | bool] = pydantic.Field(default_factory=dict)
    message: str = ""


class NodeIn(_M):
    gpus: int = pydantic.Field(default=8, ge=0, le=64)
    model: str | None = None
    gpus_expected: int | None = None
    labels: dict[str, str] = pydantic.Field(default_factory=dict)
    telemetry: str | None = pydantic.Field(default=None, description="frames sent: 1 yes, 0 or _ no")
    ports: int | None = pydantic.Field(
        default=None,
        ge=0,
        le=64,
        description="RDMA ports in the frames (mlx5_<k>/1), healthy unless a series says otherwise "
        "(baseline.healthy_port); none: frames carry no ports",
    )
    fabric_manager: str | None = pydantic.Field(
        default=None, description="fabric_manager_up of the frames: 1 running, 0 not, _ not checked"
    )
    series: dict[str, dict[str, str | float]] = pydantic.Field(default_factory=dict)
    events: list[EventIn] = pydantic.Field(default_factory=list)


class FiringOut(_M):
    rule: str
    node: str | None = None
    gpu: int | None = None
    port: str | None = None
    """A port-scope rule's port (``mlx5_3/1``: port<k> of a test node is ``mlx5_<k>/1``); unchecked
    when absent, null for a firing with no port."""
    actions: list[str] | None = None
    severity: str | None = None


class IncidentOut(_M):
    rule: str
    node: str | None = None
    gpu: int | None = None
    """A GPU incident's GPU; absent (or null) with ``gpus`` for a node-wide one."""
    gpus: list[int] | None = None
    """A node-wide incident: the GPUs that fired."""
    port: str | None = None
    """A port incident's port (``mlx5_3/1``); unchecked when absent."""


class Expect(_M):
    at: str | float
    firing: list[FiringOut] = pydantic.Field(default_factory=list)
    incidents: list[IncidentOut] | None = None
    """The incidents the firings make (node-wide groups collapsed); unchecked when absent."""


class Case(_M):
    name: str
    interval: str | float | None = None
    nodes: dict[str, NodeIn]
    expect: list[Expect]


class TestFile(_M):
    rule_files: list[str]
    interval: str | float = "10s"
    tests: list[Case]


@dataclasses.dataclass(slots=True)
class CaseResult:
    file: str
    name: str
    failures: list[str]

    @property
    def ok(self) -> bool:
        return not self.failures


def run_paths(paths: list[str | pathlib.Path]) -> list[CaseResult]:
    out: list[CaseResult] = []
    for path in loader.expand(paths):
        out += run_file(path)
    return out


def run_file(path: pathlib.Path) -> list[CaseResult]:
    try:
        doc = TestFile.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError, pydantic.ValidationError) as e:
        return [CaseResult(str(path), "<file>", [f"cannot load test file: {e}"])]
    loaded = loader.load_paths([path.parent / f for f in doc.rule_files])
    if loaded.ruleset is None:
        return [CaseResult(str(path), "<rule files>", [str(d) for d in loaded.errors])]
    results = []
    for case in doc.tests:
        try:
            failures = _run_case(loaded.ruleset, case, case.interval or doc.interval)
        except ValueError as e:
            failures = [f"bad test: {e}"]
        results.append(CaseResult(str(path), case.name, failures))
    return results


def _run_case(rules: Any, case: Case, interval: str | float) -> list[str]:
    step = durations.value(interval)
    if step <= 0:
        raise ValueError("interval must be longer than 0s")
    expects = sorted(((durations.value(e.at), e) for e in case.expect), key=lambda p: p[0])
    end = expects[-1][0] if expects else 0.0
    eng = engine.Engine(rules)
    plans = {name: _Plan(name, node) for name, node in case.nodes.items()}
    pending = sorted(
        ((durations.value(ev.at), name, ev) for name, node in case.nodes.items() for ev in node.events),
        key=lambda p: p[0],
    )
    for name, node in case.nodes.items():
        if node.labels:
            eng.set_labels(name, node.labels)
    failures: list[str] = []
    firing: list[engine.Firing] = []
    i, k = 0, 0
    while True:
        t = i * step
        if t > end + 1e-9:
            break
        while pending and pending[0][0] <= t:
            at, name, ev = pending.pop(0)
            eng.ingest_event(
                events.new(
                    name,
                    ev.kind,
                    gpu_index=ev.gpu,
                    xid=ev.xid,
                    pid=ev.pid,
                    message=ev.message,
                    details=ev.details,
                    ts=T0 + at,
                )
            )
        for plan in plans.values():
            frame = plan.frame(i, T0 + t)
            if frame is not None:
                eng.ingest(frame)
                if plan.anomaly:
                    eng.set_anomaly_scores(plan.name, plan.anomaly_at(i))
                if plan.straggler:
                    eng.set_straggler_scores(plan.name, plan.external_at(plan.straggler, i))
        firing = [f for f in eng.evaluate(T0 + t) if f.status != engine.Status.RESOLVED]
        while k < len(expects) and expects[k][0] < t + step - 1e-9:
            failures += _compare(expects[k][1], firing)
            if expects[k][1].incidents is not None:
                failures += _compare_incidents(expects[k][1], nodewide.collapse(firing, eng.gpu_count))
            k += 1
        i += 1
    return failures


class _Plan:
    def __init__(self, name: str, node: NodeIn) -> None:
        self.name = name
        self.node = node
        self.base = baseline.healthy(node.model)
        self.present = series.expand(node.telemetry) if node.telemetry else None
        self.fabric_manager = series.expand(node.fabric_manager) if node.fabric_manager else None
        self.gpu_series: dict[int, dict[str, list[float | None]]] = {}
        self.anomaly: dict[int, list[float | None]] = {}
        self.straggler: dict[int, list[float | None]] = {}
        self.port_series: dict[int, dict[str, list[float | None]]] = {}
        for key, metric_series in node.series.items():
            if key == "ports" or key.startswith("port"):
                self._port_series(key, metric_series)
                continue
            targets = range(node.gpus) if key == "all" else [_gpu_key(key, node.gpus)]
            for name_, text in metric_series.items():
                values = series.expand(text)
                if name_ in ("anomaly_score", "straggler_score"):
                    external = self.anomaly if name_ == "anomaly_score" else self.straggler
                    for g in targets:
                        external[g] = values
                    continue
                if name_ != "present":
                    metric = metric_catalog.resolve(name_)
                    if metric is None or metric.source != "sample":
                        raise ValueError(f"{name}.{key}: {name_!r} is not a GpuSample metric")
                    name_ = metric.name
                for g in targets:
                    self.gpu_series.setdefault(g, {})[name_] = values

    def _port_series(self, key: str, metric_series: dict[str, str | float]) -> None:
        count = self.node.ports or 0
        if key == "ports":
            targets: list[int] = list(range(count))
        elif key[4:].isdigit() and int(key[4:]) < count:
            targets = [int(key[4:])]
        else:
            raise ValueError(f"{self.name}: series key {key!r}: use port0..port{count - 1} or ports")
        for name_, text in metric_series.items():
            values = series.expand(text)
            if name_ != "present":
                metric = metric_catalog.resolve(name_)
                if metric is None or metric.source != "port" or metric.field is None:
                    raise ValueError(f"{self.name}.{key}: {name_!r} is not a port metric")
                name_ = metric.field
            for k in targets:
                self.port_series.setdefault(k, {})[name_] = values

    def ports(self, i: int) -> list[fabric.PortSample] | None:
        if self.node.ports is None:
            return None
        out = []
        for k in range(self.node.ports):
            values: dict[str, Any] = baseline.healthy_port()
            for name, samples in self.port_series.get(k, {}).items():
                v = _at(samples, i)
                if name == "link_layer":  # port_infiniband: 1 InfiniBand, 0 Ethernet
                    values[name] = None if v is None else "InfiniBand" if v else "Ethernet"
                else:
                    values[name] = None if v is None else v if name == "rate_gbps" else int(v)
            if values.pop("present", 1) == 0:
                continue
            out.append(fabric.PortSample(device=f"mlx5_{k}", port=1, **values))
        return out

    def frame(self, i: int, ts: float) -> telemetry.NodeFrame | None:
        if self.present is not None and not _at(self.present, i):
            return None
        gpus = []
        for g in range(self.node.gpus):
            values = dict(self.base)
            for name, samples in self.gpu_series.get(g, {}).items():
                values[name] = _at(samples, i)
            if values.pop("present", 1) == 0:
                continue
            for name, value in list(values.items()):
                field = metric_catalog.SAMPLE.get(name)
                if value is not None and field is not None and field.kind == "bool":
                    values[name] = bool(value)
                elif value is not None and field is not None and isinstance(self.base.get(name), int):
                    values[name] = int(value)
            gpus.append(telemetry.GpuSample(index=g, uuid=f"GPU-test-{self.name}-{g}", **values))
        expected = self.node.gpus_expected if self.node.gpus_expected is not None else self.node.gpus
        ports = self.ports(i)
        fm = None if self.fabric_manager is None else _at(self.fabric_manager, i)
        return telemetry.NodeFrame(
            schema=telemetry.SCHEMA if ports is None and fm is None else telemetry.SCHEMA_V2,
            fabric_manager_up=None if fm is None else bool(fm),
            node=self.name,
            ts=ts,
            seq=i,
            boot_id="test",
            agent_version="test",
            source="replay",
            gpus_expected=expected,
            gpus=gpus,
            ports=ports,
        )

    def anomaly_at(self, i: int) -> dict[int, float]:
        return self.external_at(self.anomaly, i)

    def external_at(self, external: dict[int, list[float | None]], i: int) -> dict[int, float]:
        out = {}
        for g, values in external.items():
            v = _at(values, i)
            if v is not None:
                out[g] = v
        return out


def _at(values: list[float | None], i: int) -> float | None:
    return values[i] if i < len(values) else None


def _gpu_key(key: str, count: int) -> int:
    if not key.startswith("gpu") or not key[3:].isdigit() or int(key[3:]) >= count:
        raise ValueError(f"series key {key!r}: use gpu0..gpu{count - 1} or all")
    return int(key[3:])


def _compare(expect: Expect, firing: list[engine.Firing]) -> list[str]:
    left = list(firing)
    missing = []
    for want in expect.firing:
        match = next((f for f in left if _matches(want, f)), None)
        if match is None:
            missing.append(want)
        else:
            left.remove(match)
    if not missing and not left:
        return []
    lines = [f"at {expect.at}:"]
    lines += [f"  - missing:    {_fmt_want(w)}" for w in missing]
    lines += [f"  + unexpected: {_fmt_got(f)}" for f in left]
    got = ", ".join(_fmt_got(f) for f in firing) or "nothing"
    lines.append(f"    firing then: {got}")
    return ["\n".join(lines)]


def _compare_incidents(expect: Expect, got: list[engine.Firing | nodewide.NodeGroup]) -> list[str]:
    assert expect.incidents is not None
    left = list(got)
    missing = []
    for want in expect.incidents:
        match = next((g for g in left if _incident_matches(want, g)), None)
        if match is None:
            missing.append(want)
        else:
            left.remove(match)
    if not missing and not left:
        return []
    lines = [f"at {expect.at} (incidents):"]
    lines += [f"  - missing:    {_fmt_want(w)}" for w in missing]
    lines += [f"  + unexpected: {_fmt_incident(g)}" for g in left]
    lines.append(f"    incidents then: {', '.join(_fmt_incident(g) for g in got) or 'none'}")
    return ["\n".join(lines)]


def _incident_matches(want: IncidentOut, got: engine.Firing | nodewide.NodeGroup) -> bool:
    if want.rule != got.rule_id or (want.node is not None and want.node != got.node):
        return False
    if isinstance(got, nodewide.NodeGroup):
        return want.gpu is None and (want.gpus is None or sorted(want.gpus) == list(got.gpus))
    if "port" in want.model_fields_set and want.port != got.port:
        return False
    return want.gpus is None and ("gpu" not in want.model_fields_set or want.gpu == got.gpu)


def _fmt_incident(g: engine.Firing | nodewide.NodeGroup) -> str:
    if isinstance(g, nodewide.NodeGroup):
        return f"{{rule: {g.rule_id}, node: {g.node}, gpus: [{', '.join(map(str, g.gpus))}]}}"
    gpu = "" if g.gpu is None else f", gpu: {g.gpu}"
    port = "" if g.port is None else f", port: {g.port}"
    return f"{{rule: {g.rule_id}, node: {g.node}{gpu}{port}}}"


def _matches(want: FiringOut, got: engine.Firing) -> bool:
    if want.rule != got.rule_id:
        return False
    if want.node is not None and want.node != got.node:
        return False
    if "gpu" in want.model_fields_set and want.gpu != got.gpu:
        return False
    if "port" in want.model_fields_set and want.port != got.port:
        return False
    if want.actions is not None and want.actions != got.rule.action_kinds:
        return False
    return want.severity is None or want.severity == got.rule.severity


def _fmt_want(w: FiringOut | IncidentOut) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in w.model_dump(exclude_unset=True).items()) + "}"


def _fmt_got(f: engine.Firing) -> str:
    gpu = "" if f.gpu is None else f", gpu: {f.gpu}"
    gpu += "" if f.port is None else f", port: {f.port}"
    return f"{{rule: {f.rule_id}, node: {f.node}{gpu}, actions: [{', '.join(f.rule.action_kinds)}]}}"
