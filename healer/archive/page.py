"""The report as one self-contained HTML page: inline CSS, inline SVG plots, nothing loaded from outside.

Three plots, where a person would rather look than read: the distribution of repair times (open to
resolved, a histogram on fixed buckets), the GPU-hours lost per day, stacked by cause (rule), and a map
of the repeat offenders (a row per node, a cell per GPU). The rest is tables of ``figures.build``'s data.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final

from healer import durations

REPAIR_BUCKETS_S: Final = (300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)
"""Upper bounds of the repair-time histogram's bars (a last bar takes the rest)."""
COLOURS: Final = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f")
CSS: Final = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}
td,th{padding:.2em .7em;border-bottom:1px solid #eee;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}.big{font-size:2em;font-weight:600}
.muted{color:#777}svg text{font:11px system-ui,sans-serif}
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _dur(seconds: float | None) -> str:
    return "-" if seconds is None else durations.to_text(round(seconds))


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    if not rows:
        return '<p class="muted">none</p>'
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="n">{_e(c)}</td>' if isinstance(c, int | float) else f"<td>{_e(c)}</td>" for c in row
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def repair_histogram(repairs_s: Sequence[float]) -> list[tuple[str, int]]:
    """(bucket label, repairs in it), one per ``REPAIR_BUCKETS_S`` bound and one for the rest."""
    labels, low = [], 0.0
    for high in REPAIR_BUCKETS_S:
        labels.append((f"{_dur(low)}-{_dur(high)}", low, high))
        low = high
    labels.append((f">{_dur(low)}", low, float("inf")))
    return [(label, sum(1 for r in repairs_s if lo <= r < hi)) for label, lo, hi in labels]


def bars_svg(
    bars: Sequence[tuple[str, dict[str, float]]], unit: str, width: int = 720, height: int = 220
) -> str:
    """Stacked bars: one per label, a segment per key (its colour in the legend)."""
    keys = sorted({k for _, parts in bars for k in parts})
    colour = {k: COLOURS[i % len(COLOURS)] for i, k in enumerate(keys)}
    top = max((sum(parts.values()) for _, parts in bars), default=0.0) or 1.0
    plot_h, left, bottom = height - 40, 50, height - 25
    step = (width - left - 10) / max(len(bars), 1)
    label_every = max(1, math.ceil(len(bars) * 80 / (width - left)))  # labels 80 px apart at least
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 20 * len(keys)}">']
    out.append(f'<text x="4" y="12">{_e(_num(top))} {_e(unit)}</text>')
    out.append(f'<line x1="{left}" y1="{bottom}" x2="{width - 10}" y2="{bottom}" stroke="#999"/>')
    for i, (label, parts) in enumerate(bars):
        x, y = left + i * step + 2, float(bottom)
        for key in keys:
            h = parts.get(key, 0.0) / top * plot_h
            if h > 0:
                y -= h
                out.append(
                    f'<rect x="{x:.1f}" y="{y:.1f}" width="{step - 4:.1f}" height="{h:.1f}" '
                    f'fill="{colour[key]}">'
                    f"<title>{_e(label)} {_e(key)}: {_e(_num(parts[key], 2))} {_e(unit)}</title></rect>"
                )
        if i % label_every == 0:
            out.append(f'<text x="{x:.1f}" y="{bottom + 14}">{_e(label)}</text>')
    for j, key in enumerate(keys):
        ly = height + 20 * j
        out.append(f'<rect x="{left}" y="{ly}" width="10" height="10" fill="{colour[key]}"/>')
        out.append(f'<text x="{left + 16}" y="{ly + 9}">{_e(key)}</text>')
    out.append("</svg>")
    return "".join(out)


def render(report: dict[str, Any]) -> str:
    """The whole page."""
    w, fleet, a = report["window"], report["fleet"], report["assumptions"]
    start = datetime.fromtimestamp(w["start"], tz=UTC).strftime("%Y-%m-%d %H:%M")
    end = datetime.fromtimestamp(w["end"], tz=UTC).strftime("%Y-%m-%d %H:%M")
    score = "-" if fleet["health_score"] is None else f"{fleet['health_score']:.1f}"
    avail = "-" if fleet["availability"] is None else f"{100 * fleet['availability']:.2f} %"
    hist = [(label, {"repairs": float(n)}) for label, n in repair_histogram(report["repair_times_s"])]
    by_day = report["gpu_hours_lost"]["by_day"]
    days = [(day, by_day.get(day, {})) for day in _days(w["start"], w["end"])]
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>healer reliability report</title>"
        f"<style>{CSS}</style></head><body>",
        f"<h1>Fleet reliability, {_e(start)} to {_e(end)} UTC</h1>",
        f'<p>Fleet health score <span class="big">{_e(score)}</span> &nbsp; availability {_e(avail)}'
        f" &nbsp; incidents {report['totals']['incidents']} &nbsp; GPU-hours lost "
        f"{_e(_num(report['totals']['gpu_hours_lost'], 2))}</p>",
        f'<p class="muted">{_e(a["fleet_gpus"])} GPUs ({_e(a["fleet_gpus_source"])}); a node incident counts '
        f"{_e(a['node_gpus'])} GPUs unless its evidence says; percentiles: {_e(a['percentile'])}.</p>",
        "<h2>Repair time (open to resolved)</h2>",
        bars_svg(hist, "repairs"),
        "<h2>GPU-hours lost per day, by cause</h2>",
        bars_svg(days, "GPU-hours"),
        *_tables(report),
        *_finer(report),
        "</body></html>\n",
    ]
    return "".join(parts)


def _tables(report: dict[str, Any]) -> list[str]:
    return [
        "<h2>Per rule and kind</h2>",
        _table(
            (
                "rule",
                "kind",
                "incidents",
                "escalated",
                "open",
                "containment p50",
                "p90",
                "repair p50",
                "p90",
                "ladder outcomes",
            ),
            [
                (
                    r["rule_id"],
                    r["kind"],
                    r["incidents"],
                    r["escalated"],
                    r["open"],
                    _dur(r["to_containment"]["p50_s"]),
                    _dur(r["to_containment"]["p90_s"]),
                    _dur(r["to_resolution"]["p50_s"]),
                    _dur(r["to_resolution"]["p90_s"]),
                    ", ".join(f"{k} {v}" for k, v in r["ladder_outcomes"].items()) or "-",
                )
                for r in report["by_rule"]
            ],
        ),
        "<h2>GPU-hours lost by cause</h2>",
        _table(
            ("rule", "kind", "GPU-hours"),
            [
                (c["rule_id"], c["kind"], round(c["gpu_hours"], 2))
                for c in report["gpu_hours_lost"]["by_cause"]
            ],
        ),
        "<h2>Repeat offenders (RMA candidates)</h2>",
        _table(
            ("node", "GPU", "UUID", "incidents", "mean time between", "rules", "incident ids"),
            [
                (
                    o["node"],
                    "node" if o["gpu_index"] is None else o["gpu_index"],
                    o["gpu_uuid"] or "-",
                    o["incidents"],
                    _dur(o["mean_time_between_s"]),
                    ", ".join(o["rules"]),
                    ", ".join(o["incident_ids"]),
                )
                for o in report["repeat_offenders"]
            ],
        ),
        "<h2>Circuit breaker trips</h2>",
        _table(
            ("incident", "opened", "closed"),
            [(t["incident_id"], _ts(t["opened_at"]), _ts(t["resolved_at"])) for t in report["breaker_trips"]],
        ),
        "<h2>Precision from operators' verdicts</h2>",
        _table(
            ("rule", "confirmed", "false alarms", "precision"),
            [
                (p["rule_id"], p["confirmed"], p["false_alarms"], f"{100 * p['precision']:.0f} %")
                for p in report["precision"]
            ],
        ),
        "<h3>By anomaly component (what drove the model's score)</h3>",
        _table(
            ("component", "confirmed", "false alarms", "precision"),
            [
                (p["component"], p["confirmed"], p["false_alarms"], f"{100 * p['precision']:.0f} %")
                for p in report["precision_by_component"]
            ],
        ),
    ]


def offender_map_svg(rows: Sequence[dict[str, Any]], gpus: int = 8) -> str:
    """The repeat offenders' map: a row per node with a repeat offender, a cell per GPU (and one for the
    node's own incidents), darker with more fault incidents in the repeat window."""
    if not rows:
        return '<p class="muted">none</p>'
    top = max(n for r in rows for n in r["counts"].values())
    cols = ["node", *(str(g) for g in range(gpus))]
    cell, left = 22, 120
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + cell * len(cols) + 10}" '
        f'height="{cell * (len(rows) + 1) + 10}">'
    ]
    for j, c in enumerate(cols):
        out.append(f'<text x="{left + j * cell + 4}" y="14">{_e("n" if c == "node" else c)}</text>')
    for i, r in enumerate(rows):
        y = cell * (i + 1)
        out.append(f'<text x="4" y="{y + 15}">{_e(r["node"])}</text>')
        for j, c in enumerate(cols):
            n = r["counts"].get(c, 0)
            shade = "#eee" if n == 0 else f"rgba(225,87,89,{0.25 + 0.75 * n / top:.2f})"
            out.append(
                f'<rect x="{left + j * cell}" y="{y}" width="{cell - 2}" height="{cell - 2}" fill="{shade}">'
                f"<title>{_e(r['node'])} {'node' if c == 'node' else 'GPU ' + c}: {n} incidents</title>"
                "</rect>"
            )
    out.append("</svg>")
    return "".join(out)


def _finer(report: dict[str, Any]) -> list[str]:
    """The finer figures (healer.archive.breakdown)."""
    lost, repair, tbf = report["gpu_hours_lost"], report["repair"], report["between_failures"]
    spread = ("count", "p50", "p90")

    def spreads(rows: Sequence[dict[str, Any]], key: str) -> list[tuple[object, ...]]:
        return [(r[key], r["count"], _dur(r["p50_s"]), _dur(r["p90_s"])) for r in rows]

    labels = [
        (key, value, round(h, 2)) for key, values in lost["by_label"].items() for value, h in values.items()
    ]
    mtbf = tbf["fleet_mtbf_gpu_hours"]
    return [
        "<h2>Map of repeat offenders</h2>",
        offender_map_svg(report["repeat_map"], report["assumptions"]["node_gpus"]),
        "<h2>GPU-hours lost by scheduler state</h2>",
        _table(("state", "GPU-hours"), [(k, round(v, 2)) for k, v in lost["by_state"].items()]),
        "<h2>GPU-hours lost by pool or domain</h2>",
        _table(("label", "value", "GPU-hours"), labels),
        "<h2>Time to repair by action and by ladder rung</h2>",
        _table(("action that took effect", *spread), spreads(repair["by_action"], "action")),
        _table(("deepest rung", *spread), spreads(repair["by_rung"], "rung")),
        "<h2>Time between failures</h2>",
        f"<p>Per GPU (consecutive fault incidents of one GPU or node): {tbf['per_gpu']['count']} gaps, p50 "
        f"{_e(_dur(tbf['per_gpu']['p50_s']))}, p90 {_e(_dur(tbf['per_gpu']['p90_s']))}. Fleet mean: "
        f"{'-' if mtbf is None else _e(_num(mtbf, 0))} GPU-hours per incident.</p>",
        "<h2>Shared-cause incidents (failure domains)</h2>",
        _table(
            ("incident", "domain", "suspected", "members", "opened", "closed", "outcome"),
            [
                (
                    d["incident_id"],
                    d["domain"],
                    d["suspected"] or "-",
                    f"{d['member_count']} of {d['size']}" if d["member_count"] is not None else "-",
                    _ts(d["opened_at"]),
                    _ts(d["resolved_at"]),
                    d["outcome"] or "-",
                )
                for d in report["shared_cause"]
            ],
        ),
        "<h2>Power budgets: caps and energy</h2>",
        _table(
            ("incident", "domain", "capped for", "most GPUs capped", "energy kWh", "opened"),
            [
                (
                    p["incident_id"],
                    p["domain"],
                    _dur(p["capped_s"]),
                    p["max_capped_gpus"] or "-",
                    "-" if p["energy_kwh"] is None else p["energy_kwh"],
                    _ts(p["opened_at"]),
                )
                for p in report["power_budgets"]
            ],
        ),
    ]


def _ts(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _days(start: float, end: float) -> list[str]:
    """Every UTC date the window touches, so a day without loss shows as an empty bar."""
    out, t = [], start
    while t < end:
        out.append(datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d"))
        t = (t // 86400 + 1) * 86400
    return out
