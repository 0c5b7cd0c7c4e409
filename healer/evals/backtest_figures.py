"""A backtest's figures (``backtest``): each incident true or false against the ground truth, each fault
caught or missed with its latency and its lead over the kind's static rule (``STATIC_RULES``), rates per
1,000 healthy node-days with an exact (Garwood) 95 % upper bound (``upper95``), recordings added up
(``summarize``) and printed (``format_summary``).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import statistics
from collections.abc import Iterable
from typing import Any, Final

STATIC_RULES: Final = {
    "cooling_degradation": "gpu-temp-near-slowdown",
    "inlet_failure": "gpu-temp-near-slowdown",
    "node_cooling_loss": "gpu-temp-near-slowdown",
    "nvlink_crc_rising": "nvlink-crc-storm",
    "pcie_replay_storm": "pcie-replay-rate",
    "ecc_sbe_storm": "ecc-sbe-rate-high",
    "fail_slow": "gpu-straggler",
}
"""Per fault kind, the static rule a lead time is measured against (``evals.model_eval.STATIC_RULES`` plus
the shared generators' ``node_cooling_loss``, and ``fail_slow``: the fail-slow scorer's rule)."""


@dataclasses.dataclass
class Incident:
    node: str
    gpu: int | None
    at: float
    rule: str
    component: str = ""
    """For an anomaly incident: the component that drove the score when it opened."""


def upper95(k: int, exposure: float) -> float | None:
    """Exact (Garwood) two-sided 95 % upper bound of a Poisson rate: ``k`` events in ``exposure``
    (the rate whose chance of ``k`` or fewer events is 2.5 %; 3.69 for k = 0)."""
    if exposure <= 0:
        return None

    def cdf(lam: float) -> float:
        term = total = math.exp(-lam)
        for i in range(1, k + 1):
            term *= lam / i
            total += term
        return total

    lo, hi = float(k), float(k) + 10.0 + 10.0 * math.sqrt(k + 1)
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) > 0.025 else (lo, mid)
    return hi / exposure


def is_false(h: Incident, truth: list[dict[str, Any]]) -> bool:
    return not any(
        f["node"] == h.node
        and f["start"] <= h.at
        and (f["gpu"] is None or h.gpu is None or f["gpu"] == h.gpu)
        for f in truth
    )


def node_episodes(hits: list[Incident], gap_s: float) -> int:
    by_node: dict[str, list[float]] = collections.defaultdict(list)
    for h in hits:
        by_node[h.node].append(h.at)
    n = 0
    for ts in by_node.values():
        ts.sort()
        n += 1 + sum(b - a > gap_s for a, b in itertools.pairwise(ts))
    return n


def _first(hits: Iterable[Incident], f: dict[str, Any], rule: str | None = None) -> float | None:
    ts = [
        h.at
        for h in hits
        if h.node == f["node"]
        and h.at >= f["start"]
        and (rule is None or h.rule == rule)
        and (f["gpu"] is None or h.gpu is None or h.gpu == f["gpu"])
    ]
    return min(ts) if ts else None


def fault_outcome(
    f: dict[str, Any], model_hits: list[Incident], rule_hits: list[Incident], end: float
) -> dict[str, Any]:
    m = _first(model_hits, f)
    static_rule = STATIC_RULES.get(f["kind"])
    s = _first(rule_hits, f, static_rule) if static_rule else None
    r = _first(rule_hits, f)
    return {
        "kind": f["kind"],
        "node": f["node"],
        "gpu": f["gpu"],
        "model_s": None if m is None else m - f["start"],
        "static_rule": static_rule,
        "static_rule_s": None if s is None else s - f["start"],
        "any_rule_s": None if r is None else r - f["start"],
        "until_end_s": end - f["start"],
    }


def _ahead(fs: list[dict[str, Any]], margin_s: float) -> int:
    """Faults caught at least ``margin_s`` before the static rule (or before the recording ended, where
    the static rule never fired)."""
    n = 0
    for f in fs:
        if f["model_s"] is None:
            continue
        ref = f["static_rule_s"] if f["static_rule_s"] is not None else f["until_end_s"]
        if ref - f["model_s"] >= margin_s and (margin_s > 0 or ref > f["model_s"]):
            n += 1
    return n


def _rate(k: int, days: float) -> dict[str, float | int | None]:
    up = upper95(k, days)
    return {
        "count": k,
        "per_1000_node_days": 1000.0 * k / days if days > 0 else None,
        "upper95_per_1000_node_days": None if up is None else 1000.0 * up,
    }


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures over several recordings: per model (false incidents and node episodes per 1,000 healthy
    node-days with the 95 % upper bound, and per fault kind catches, latency and lead over the static
    rule), per rule (false firings per 1,000 healthy node-days)."""
    days = sum(r["healthy_node_days"] for r in results)
    rule_days = sum(r["healthy_node_days"] for r in results if r["with_rules"])
    models: dict[str, Any] = {}
    for name in results[0]["models"] if results else []:
        rs = [r["models"][name] for r in results]
        kinds: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        for r in rs:
            for f in r["faults"]:
                kinds[f["kind"]].append(f)
        per_kind = {}
        for kind, fs in sorted(kinds.items()):
            caught = [f for f in fs if f["model_s"] is not None]
            static = [f for f in caught if f["static_rule_s"] is not None]
            per_kind[kind] = {
                "faults": len(fs),
                "caught": len(caught),
                "recall": len(caught) / len(fs),
                "median_latency_s": statistics.median(f["model_s"] for f in caught) if caught else None,
                "static_rule": STATIC_RULES.get(kind),
                "static_rule_caught": sum(f["static_rule_s"] is not None for f in fs),
                "any_rule_caught": sum(f["any_rule_s"] is not None for f in fs),
                "before_static": _ahead(fs, 0.0),
                "ge_10min_before_static": _ahead(fs, 600.0),
                "share_before_static": _ahead(fs, 0.0) / len(fs),
                "share_ge_10min_before_static": _ahead(fs, 600.0) / len(fs),
                "median_lead_vs_static_s": (
                    statistics.median(f["static_rule_s"] - f["model_s"] for f in static) if static else None
                ),
            }
        comp: collections.Counter[str] = collections.Counter()
        for r in rs:
            comp.update(r["false_by_component"])
        models[name] = {
            "incidents": sum(r["incidents"] for r in rs),
            "false_incidents": _rate(sum(r["false"] for r in rs), days),
            "false_node_episodes": _rate(sum(r["false_node_episodes"] for r in rs), days),
            "false_controller_incidents": _rate(sum(r.get("false_controller", 0) for r in rs), days),
            "false_by_component": dict(comp),
            "per_kind": per_kind,
        }
    rules: dict[str, Any] = {}
    for r in results:
        for rid, v in r["rules"].items():
            e = rules.setdefault(rid, {"incidents": 0, "false": 0})
            e["incidents"] += v["incidents"]
            e["false"] += v["false"]
    for v in rules.values():
        v["false_rate"] = _rate(v["false"], rule_days)
    rule_kinds: dict[str, dict[str, Any]] = {}
    for r in results:
        for f in r["rule_faults"]:
            e = rule_kinds.setdefault(
                f["kind"],
                {"faults": 0, "static_rule": f["static_rule"], "static_rule_caught": 0, "any_rule_caught": 0},
            )
            e["faults"] += 1
            e["static_rule_caught"] += f["static_rule_s"] is not None
            e["any_rule_caught"] += f["any_rule_s"] is not None
    bad: collections.Counter[str] = collections.Counter()
    for r in results:
        bad.update(r["bad_frames"])
    return {
        "recordings": len(results),
        "frames": sum(r["frames"] for r in results),
        "bad_frames": dict(bad),
        "nodes": sum(r["nodes"] for r in results),
        "healthy_node_days": days,
        "faults": sum(len(r["faults"]) for r in results),
        "models": models,
        "rules": dict(sorted(rules.items())),
        "rules_per_kind": dict(sorted(rule_kinds.items())),
        "rules_false_total": _rate(sum(v["false"] for v in rules.values()), rule_days) if rule_days else None,
    }


def _m(v: float | None) -> str:
    return "-" if v is None else f"{v / 60:.1f}"


def _r(rate: dict[str, Any]) -> str:
    per = rate["per_1000_node_days"]
    up = rate["upper95_per_1000_node_days"]
    if per is None:
        return f"{rate['count']} (no healthy node-days)"
    return f"{rate['count']} ({per:.1f} per 1,000 node-days, 95 % upper bound {up:.1f})"


def format_summary(s: dict[str, Any]) -> str:
    """The human-readable form of ``summarize``'s result."""
    lines = [
        f"recordings {s['recordings']}, frames {s['frames']}, nodes {s['nodes']}, "
        f"healthy node-days {s['healthy_node_days']:.2f}, faults {s['faults']}"
        + (
            f", undecodable frames {sum(s['bad_frames'].values())} {s['bad_frames']}"
            if s["bad_frames"]
            else ""
        )
    ]
    for name, m in s["models"].items():
        lines.append("")
        lines.append(f"model {name}: anomaly incidents {m['incidents']}")
        lines.append(f"  false incidents      {_r(m['false_incidents'])}")
        lines.append(f"  false node episodes  {_r(m['false_node_episodes'])}")
        lines.append(f"  false incidents (node-wide grouping) {_r(m['false_controller_incidents'])}")
        if m["false_by_component"]:
            lines.append(
                "  false by component   "
                + ", ".join(f"{k} {v}" for k, v in sorted(m["false_by_component"].items()))
            )
        if m["per_kind"]:
            lines.append(
                f"  {'fault kind':<22} {'n':>3} {'caught':>6} {'median min':>10} {'static rule':<24} "
                f"{'rule':>4} {'before':>6} {'>=10m':>5} {'lead min':>8}"
            )
            for kind, k in m["per_kind"].items():
                lines.append(
                    f"  {kind:<22} {k['faults']:>3} {k['caught']:>6} {_m(k['median_latency_s']):>10} "
                    f"{k['static_rule'] or '-':<24} {k['static_rule_caught']:>4} {k['before_static']:>6} "
                    f"{k['ge_10min_before_static']:>5} {_m(k['median_lead_vs_static_s']):>8}"
                )
    if s["rules"]:
        lines.append("")
        lines.append(
            f"{'rule':<32} {'incidents':>9} {'false':>6}  false per 1,000 healthy node-days (95 % upper)"
        )
        for rid, v in s["rules"].items():
            fr = v["false_rate"]
            per = fr["per_1000_node_days"]
            up = fr["upper95_per_1000_node_days"]
            lines.append(
                f"{rid:<32} {v['incidents']:>9} {v['false']:>6}  "
                + ("-" if per is None else f"{per:.1f} ({up:.1f})")
            )
    if s.get("rules_per_kind"):
        lines.append("")
        lines.append(f"{'fault kind (rules)':<22} {'n':>3} {'static rule':<24} {'caught':>6} {'any rule':>8}")
        for kind, k in s["rules_per_kind"].items():
            lines.append(
                f"{kind:<22} {k['faults']:>3} {k['static_rule'] or '-':<24} {k['static_rule_caught']:>6} "
                f"{k['any_rule_caught']:>8}"
            )
    if s.get("rules_false_total"):
        lines.append(f"every rule but the anomaly rule: false incidents {_r(s['rules_false_total'])}")
    return "\n".join(lines)
