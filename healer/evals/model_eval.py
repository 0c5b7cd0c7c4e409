"""Measuring the model against ground truth and against the default rules, on simulated scenarios.

Each scenario is simulated with its own seed (never the training seed), recorded, then:

- **model**: window features every ``bucket_s`` from the recording, scored; an *anomaly incident* is
  what the default pack's ``anomaly-score-high`` rule does with the score: ``anomaly_score >= 0.9``
  held for ``hold_s`` (the rule's ``for``: 300 s in the default pack). A *flag* is the first window at
  or above 0.9.
- **rules**: the recording's frames, decoded as the controller decodes them, through the rule engine
  with the default pack (the anomaly rule left out), evaluated every ``rules_every_s``.

A fault is detected by a detector when it raises an incident on the fault's GPU (any GPU of the node for
node-scope kinds) at or after the fault's start and before it ended. An incident on a GPU or node with no
fault started yet is a false incident. Lead time = rule's first firing - model's incident (positive:
the model was earlier).
"""

from __future__ import annotations

import collections
import dataclasses
import pathlib
import statistics
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from healer import anomaly, errors
from healer.anomaly import dataset, diagnosis
from healer.anomaly import model as anomaly_model
from healer.rules import engine, firing, loader, ruleset
from healer.schemas import codec

ANOMALY_RULE = "anomaly-score-high"
STATIC_RULES = {
    "cooling_degradation": "gpu-temp-near-slowdown",
    "inlet_failure": "gpu-temp-near-slowdown",
    "nvlink_crc_rising": "nvlink-crc-storm",
    "pcie_replay_storm": "pcie-replay-rate",
    "ecc_sbe_storm": "ecc-sbe-rate-high",
}
"""Per fault kind, the static threshold / rate rule the model is compared with (besides the first rule
of any kind to fire, which for NVLink is the any-replay warning)."""
Hit = diagnosis.Hit


@dataclasses.dataclass(frozen=True)
class Episodes:
    """How the anomaly rule turns scores into incidents (the default pack's ``anomaly-score-high``)."""

    hold_s: float = 300.0
    """``for``: the score must stay at or above 0.9 this long."""
    resolve_below: float = anomaly_model.SCORE_THRESHOLD
    """``resolve.when``: an open incident resolves once the score is below this ..."""
    resolve_s: float = 0.0
    """... for this long (``resolve.for``)."""
    cooldown_s: float = 0.0
    """``cooldown``: after resolving, the GPU cannot open another incident for this long."""


def incidents_from_scores(
    scores: npt.NDArray[np.float64], w: dataset.Windows, hold_s: float, episodes: Episodes | None = None
) -> tuple[list[Hit], list[Hit]]:
    """(incidents, flags) of the anomaly rule over scores (windows, nodes, gpus): an incident opens
    when the score has held >= 0.9 for ``hold_s`` (outside a cooldown) and stays open until it has
    been below ``episodes.resolve_below`` for ``episodes.resolve_s``; a flag is the first window of
    each run at or above 0.9."""
    ep = dataclasses.replace(episodes or Episodes(), hold_s=hold_s)
    high = scores >= anomaly_model.SCORE_THRESHOLD
    low = scores < ep.resolve_below
    incidents: list[Hit] = []
    flags: list[Hit] = []
    for n, g in zip(*np.nonzero(high.any(axis=0)), strict=True):
        run_start: float | None = None
        open_ = False
        low_since: float | None = None
        cool_until = -np.inf
        for k in range(len(w.ts)):
            t = float(w.ts[k])
            if high[k, n, g]:
                if run_start is None:
                    run_start = t
                    flags.append((w.node_names[n], int(g), t, "flag"))
            else:
                run_start = None
            if open_:
                if low[k, n, g]:
                    low_since = t if low_since is None else low_since
                    if t - low_since >= ep.resolve_s:
                        open_, low_since, cool_until = False, None, t + ep.cooldown_s
                else:
                    low_since = None
            elif run_start is not None and t - run_start >= ep.hold_s and t >= cool_until:
                incidents.append((w.node_names[n], int(g), t, ANOMALY_RULE))
                open_ = True
    return incidents, flags


def model_incidents(
    m: anomaly_model.Model, w: dataset.Windows, hold_s: float
) -> tuple[list[Hit], list[Hit], npt.NDArray[np.float64]]:
    """(incidents, flags, scores (windows, nodes, gpus)) of the model over recorded windows."""
    scored = diagnosis.score_windows(m, w)
    incidents, flags = incidents_from_scores(scored.scores, w, hold_s)
    return incidents, flags, scored.scores


def rule_incidents(path: pathlib.Path, rules: ruleset.RuleSet, gpus: int, every_s: float) -> list[Hit]:
    """First firings of every rule on the recording's frames (decoded as the controller decodes them)."""
    from healer.sim import recording

    eng = engine.Engine(rules, gpus_per_node=gpus, stale_after_s=300.0)
    out: list[Hit] = []
    next_eval: float | None = None
    with recording.Recording(path) as rec:
        evts = collections.deque(sorted(rec.events(), key=lambda e: e["ts"]))
        for ts, frames in rec.frames():
            while evts and evts[0]["ts"] <= ts:
                eng.ingest_event(codec.decode_event(orjson.dumps(evts.popleft())))
            for _, data in frames:
                eng.ingest(codec.decode_frame(data), at=ts)
            if next_eval is None:
                next_eval = ts
            if ts >= next_eval:
                for f in eng.evaluate(ts):
                    if f.status is firing.Status.FIRED:
                        out.append((f.node, f.gpu, ts, f.rule.id))
                next_eval = ts + every_s
    return out


def _default_rules(paths: Sequence[str | pathlib.Path]) -> ruleset.RuleSet:
    result = loader.load_paths(paths)
    if result.ruleset is None:
        raise errors.PermanentError(
            "rule pack has errors: " + "; ".join(str(d.message) for d in result.errors)
        )
    kept = tuple(r for r in result.ruleset.rules if r.id != ANOMALY_RULE)
    return ruleset.RuleSet(rules=kept, files=result.ruleset.files)


def _matches(hit: Hit, fault: dict[str, Any], run_end: float) -> bool:
    node, gpu, t, _ = hit
    if node != fault["node"] or t < fault["start"]:
        return False
    if fault.get("end") is not None and t > fault["end"] + 60:
        return False
    return t <= run_end and (fault.get("gpu") is None or gpu is None or gpu == fault["gpu"])


def _first(hits: list[Hit], fault: dict[str, Any], run_end: float) -> Hit | None:
    found = [h for h in hits if _matches(h, fault, run_end)]
    return min(found, key=lambda h: h[2]) if found else None


def _is_false(hit: Hit, truth: list[dict[str, Any]]) -> bool:
    node, gpu, t, _ = hit
    return not any(
        f["node"] == node and f["start"] <= t and (f.get("gpu") is None or gpu is None or f["gpu"] == gpu)
        for f in truth
    )


def _healthy_node_s(truth: list[dict[str, Any]], nodes: list[str], start: float, end: float) -> float:
    total = 0.0
    for n in nodes:
        first = min((f["start"] for f in truth if f["node"] == n), default=end)
        total += max(0.0, min(first, end) - start)
    return total


SCENARIO_DIR = pathlib.Path(anomaly.__file__).parent / "scenarios"
"""The model's own scenarios (training and evaluation) ship with ``healer.anomaly``."""
EVAL_SCENARIOS = ("random-healthy", "random-cooling", "random-inlet", "random-nvlink")
"""The default evaluation set: the randomised family (a varied healthy fleet and three fault kinds on it)."""


def resolve_scenario(name: str) -> str:
    """A name from ``healer.anomaly``'s scenarios/ directory, else what ``sim.scenarios.load`` takes."""
    own = SCENARIO_DIR / f"{name}.yaml"
    return str(own) if own.is_file() else name


def evaluate_scenario(
    m: anomaly_model.Model,
    scenario: str,
    *,
    nodes: int,
    hours: float,
    seed: int,
    interval_s: float = 5.0,
    rules_paths: Sequence[str | pathlib.Path] = ("rules",),
    rules_every_s: float = 10.0,
    hold_s: float = 300.0,
    episodes: Episodes | None = None,
    with_rules: bool = True,
    workdir: str | pathlib.Path | None = None,
    traces: int = 0,
) -> dict[str, Any]:
    """Simulate, record and score one scenario; per-fault outcomes for both detectors."""
    from healer.sim import recording, scenarios

    sim = scenarios.build(scenarios.load(resolve_scenario(scenario)), nodes=nodes, gpus=8, seed=seed)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = pathlib.Path(tmp) / "eval.npz"
        recording.record(sim, path, duration_s=hours * 3600, interval_s=interval_s)
        w = dataset.from_recording(path, window_s=m.settings.window_s, bucket_s=m.settings.bucket_s)
        with recording.Recording(path) as rec:
            truth = rec.truth()
            start = float(rec.meta["start_ts"])
        run_end = start + hours * 3600
        scored = diagnosis.score_windows(m, w)
        incidents, flags = incidents_from_scores(scored.scores, w, hold_s, episodes)
        rule_hits = rule_incidents(path, _default_rules(rules_paths), 8, rules_every_s) if with_rules else []
    faults = []
    for f in truth:
        mi, mf, ri = _first(incidents, f, run_end), _first(flags, f, run_end), _first(rule_hits, f, run_end)
        named = [h for h in rule_hits if h[3] == STATIC_RULES.get(f["kind"])]
        si = _first(named, f, run_end)
        faults.append(
            {
                "kind": f["kind"],
                "node": f["node"],
                "gpu": f.get("gpu"),
                "start": f["start"],
                "visible_at": f["visible_at"],
                "model_incident_s": None if mi is None else mi[2] - f["visible_at"],
                "model_flag_s": None if mf is None else mf[2] - f["visible_at"],
                "until_end_s": run_end - f["visible_at"],
                "rule_s": None if ri is None else ri[2] - f["visible_at"],
                "rule_id": None if ri is None else ri[3],
                "static_rule_s": None if si is None else si[2] - f["visible_at"],
            }
        )
    return {
        "scenario": scenario,
        "seed": seed,
        "nodes": nodes,
        "hours": hours,
        "healthy_node_days": _healthy_node_s(truth, w.node_names, start, run_end) / 86400,
        "model_incidents": len(incidents),
        "model_false": sum(_is_false(h, truth) for h in incidents),
        "model_false_detail": [
            diagnosis.explain(h, w, scored, start) for h in incidents if _is_false(h, truth)
        ],
        "healthy_margin": diagnosis.healthy_margin(w, scored, truth, hold_s),
        "with_rules": with_rules,
        "rule_incidents": len(rule_hits),
        "rule_false": sum(_is_false(h, truth) for h in rule_hits),
        "faults": faults,
        "traces": _traces(faults, w, scored, traces),
    }


TRACE_KEYS = ("kind", "node", "gpu", "visible_at", "model_incident_s", "static_rule_s")


def _traces(
    faults: list[dict[str, Any]], w: dataset.Windows, scored: diagnosis.Scored, limit: int
) -> list[dict[str, Any]]:
    """The score over time of the first ``limit`` faulted GPUs, for ``healer model eval --plots``."""
    out: list[dict[str, Any]] = []
    for f in faults:
        if len(out) >= limit:
            break
        if f["gpu"] is None or f["node"] not in w.node_names:
            continue
        n = w.node_names.index(f["node"])
        out.append(
            {
                **{
                    k: f[k]
                    for k in ("kind", "node", "gpu", "visible_at", "model_incident_s", "static_rule_s")
                },
                "ts": [float(t) for t in w.ts],
                "score": [float(x) for x in scored.scores[:, n, int(f["gpu"])]],
                "threshold": anomaly_model.SCORE_THRESHOLD,
            }
        )
    return out


def _share_ahead(fs: list[dict[str, Any]], model_key: str, margin_s: float) -> float:
    """Share of faults the model caught at least ``margin_s`` before the kind's static rule; a fault the
    rule never caught within the run counts when the model caught it ``margin_s`` before the run ended
    (the rule's firing, if any, is later still)."""
    ahead = 0
    for f in fs:
        t = f[model_key]
        if t is None:
            continue
        rule_t = f["static_rule_s"] if f["static_rule_s"] is not None else f.get("until_end_s")
        if rule_t is not None and rule_t - t >= margin_s and (margin_s > 0 or rule_t > t):
            ahead += 1
    return ahead / len(fs)


def _max_held(results: list[dict[str, Any]]) -> dict[str, float]:
    """Per component, the highest ``healthy_margin`` value over all scenarios."""
    out: dict[str, float] = {}
    for r in results:
        for k, v in r.get("healthy_margin", {}).get("by_component", {}).items():
            out[k] = max(out.get(k, 0.0), v)
    return out


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per fault kind and overall figures from ``evaluate_scenario`` results."""
    kinds: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    false_in: dict[str, int] = collections.defaultdict(int)
    for r in results:
        for f in r["faults"]:
            kinds[f["kind"]].append(f)
        for k in {f["kind"] for f in r["faults"]}:
            false_in[k] += r["model_false"]
    per_kind = {}
    for kind, fs in sorted(kinds.items()):
        det = [f for f in fs if f["model_incident_s"] is not None]
        both = [f for f in det if f["rule_s"] is not None]
        leads = [f["rule_s"] - f["model_incident_s"] for f in both]
        flag_leads = [f["rule_s"] - f["model_flag_s"] for f in both if f["model_flag_s"] is not None]
        static = [f for f in det if f["static_rule_s"] is not None]
        static_leads = [f["static_rule_s"] - f["model_incident_s"] for f in static]
        rules_first = collections.Counter(f["rule_id"] for f in fs if f["rule_id"])
        per_kind[kind] = {
            "faults": len(fs),
            "model_recall": len(det) / len(fs),
            "model_precision": len(det) / (len(det) + false_in[kind]) if det or false_in[kind] else None,
            "rule_recall": sum(f["rule_s"] is not None for f in fs) / len(fs),
            "rule": rules_first.most_common(1)[0][0] if rules_first else None,
            "median_lead_s": statistics.median(leads) if leads else None,
            "median_flag_lead_s": statistics.median(flag_leads) if flag_leads else None,
            "share_lead_ge_600s": (sum(x >= 600 for x in leads) / len(fs)) if fs else None,
            "share_model_first": (sum(x > 0 for x in leads) / len(fs)) if fs else None,
            "static_rule": STATIC_RULES.get(kind),
            "static_rule_recall": sum(f["static_rule_s"] is not None for f in fs) / len(fs),
            "median_lead_vs_static_s": statistics.median(static_leads) if static_leads else None,
            "share_before_static": _share_ahead(fs, "model_incident_s", 0.0),
            "share_10min_before_static": _share_ahead(fs, "model_incident_s", 600.0),
            "share_flag_before_static": _share_ahead(fs, "model_flag_s", 0.0),
            "share_flag_10min_before_static": _share_ahead(fs, "model_flag_s", 600.0),
            "median_model_latency_s": statistics.median(f["model_incident_s"] for f in det) if det else None,
        }
    days = sum(r["healthy_node_days"] for r in results)
    mf = sum(r["model_false"] for r in results)
    rf = sum(r["rule_false"] for r in results)
    rule_days = sum(r["healthy_node_days"] for r in results if r["with_rules"])
    mi = sum(r["model_incidents"] for r in results)
    return {
        "per_kind": per_kind,
        "healthy_node_days": days,
        "model_incidents": mi,
        "model_false_incidents": mf,
        "model_precision": (mi - mf) / mi if mi else None,
        "model_false_per_1000_node_days": 1000 * mf / days if days else None,
        "healthy_max_held": _max_held(results),
        "model_false_by_component": dict(
            collections.Counter(d["component"] for r in results for d in r.get("model_false_detail", []))
        ),
        "rule_false_incidents": rf,
        "rule_false_per_1000_node_days": 1000 * rf / rule_days if rule_days else None,
        "scenarios": [{k: v for k, v in r.items() if k != "faults"} for r in results],
    }


def run(
    m: anomaly_model.Model,
    scenario_names: Sequence[str],
    *,
    nodes: int,
    hours: float,
    seed: int,
    progress: Callable[[str], None] | None = None,
    **options: Any,
) -> dict[str, Any]:
    results = []
    for k, name in enumerate(scenario_names):
        if progress:
            progress(name)
        results.append(evaluate_scenario(m, name, nodes=nodes, hours=hours, seed=seed + k, **options))
    return summarize(results) | {"raw": results}
