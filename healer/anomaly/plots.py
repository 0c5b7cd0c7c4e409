"""Pictures of what the anomaly model sees, from ``healer model eval`` results (``--plots DIR``).

Three PNGs a person reads at a glance, drawn with matplotlib (the ``plots`` extra; the Agg backend, no
display needed):

- ``lead_time.png``: per fault kind, how many minutes the model's incident came before the fault kind's
  static rule (one dot per fault; faults the static rule never caught sit at the right edge, faults the
  model missed at the left), with the 10-minute target line;
- ``healthy_margin.png``: per score component, the highest value healthy GPUs held for the rule's whole
  hold, against 1.0 (enough to fire on that component alone): far below the line means false incidents
  are rare for a reason, not by luck of the seeds;
- ``score_traces.png``: the score over time of a few faulted GPUs, with the fault's onset, the model's
  incident and the static rule's firing marked (only when the evaluation kept traces).

``write(result, out_dir)`` takes the dict ``evaluation.run`` returns (the summary, per-scenario results
under ``raw``) and writes what it has data for;
it returns the paths written.
"""

from __future__ import annotations

import pathlib
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

LEAD_TARGET_MIN = 10.0
NEVER_MIN = 120.0
"""Where a fault the static rule never caught is drawn (minutes ahead), at the plot's right edge."""
MISSED_MIN = -30.0
"""Where a fault the model missed is drawn, at the left edge."""


def _faults(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for r in result.get("raw", []) for f in r.get("faults", [])]


def lead_time(result: dict[str, Any], path: pathlib.Path) -> pathlib.Path | None:
    faults = _faults(result)
    kinds = sorted({f["kind"] for f in faults})
    if not kinds:
        return None
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.7 * len(kinds)))
    for y, kind in enumerate(kinds):
        xs = []
        for f in faults:
            if f["kind"] != kind:
                continue
            if f["model_incident_s"] is None:
                xs.append(MISSED_MIN)
            elif f["static_rule_s"] is None:
                xs.append(NEVER_MIN)
            else:
                xs.append(min(NEVER_MIN, (f["static_rule_s"] - f["model_incident_s"]) / 60.0))
        jitter = [y + 0.08 * ((i % 5) - 2) for i in range(len(xs))]
        ax.scatter(xs, jitter, s=28, alpha=0.8)
        ahead = sum(x >= LEAD_TARGET_MIN for x in xs)
        ax.text(NEVER_MIN + 4, y, f"{ahead}/{len(xs)} ≥ {LEAD_TARGET_MIN:g} min", va="center", fontsize=9)
    ax.axvline(LEAD_TARGET_MIN, color="green", linestyle="--", linewidth=1, label="10 min target")
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_yticks(range(len(kinds)), kinds)
    ax.set_xlim(MISSED_MIN - 5, NEVER_MIN + 35)
    ax.set_xlabel(
        f"minutes the model's incident came before the static rule "
        f"(left edge: model missed; {NEVER_MIN:g}: rule never fired)"
    )
    ax.set_title("Lead time over the static rule, per fault")
    ax.legend(loc="upper center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def healthy_margin(result: dict[str, Any], path: pathlib.Path) -> pathlib.Path | None:
    held: dict[str, float] = result.get("healthy_max_held") or {}
    if not held:
        return None
    names = sorted(held)
    values = [held[n] for n in names]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.5 * len(names)))
    colours = ["tab:red" if v >= 1.0 else "tab:orange" if v >= 0.8 else "tab:green" for v in values]
    ax.barh(names, values, color=colours)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1, label="enough to fire alone")
    for y, v in enumerate(values):
        ax.text(v + 0.01, y, f"{v:.2f}", va="center", fontsize=9)
    days = result.get("healthy_node_days")
    ax.set_xlim(0, max(1.2, max(values) + 0.15))
    ax.set_xlabel("highest value held for the whole hold by a healthy GPU")
    ax.set_title(f"Healthy margin per component ({days:.0f} healthy node-days)" if days else "Healthy margin")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def score_traces(result: dict[str, Any], path: pathlib.Path, limit: int = 4) -> pathlib.Path | None:
    traces = [t for r in result.get("raw", []) for t in r.get("traces", [])][:limit]
    if not traces:
        return None
    fig, axes = plt.subplots(len(traces), 1, figsize=(9, 2.2 * len(traces)), sharex=False, squeeze=False)
    for ax, t in zip(axes[:, 0], traces, strict=True):
        t0 = t["visible_at"]
        minutes = [(x - t0) / 60.0 for x in t["ts"]]
        ax.plot(minutes, t["score"], linewidth=1.2, label="anomaly score")
        ax.axhline(t.get("threshold", 0.9), color="grey", linestyle=":", linewidth=1, label="threshold")
        ax.axvline(0, color="black", linewidth=1, label="fault visible")
        if t.get("model_incident_s") is not None:
            ax.axvline(t["model_incident_s"] / 60.0, color="tab:blue", linestyle="--", label="model incident")
        if t.get("static_rule_s") is not None:
            ax.axvline(t["static_rule_s"] / 60.0, color="tab:red", linestyle="--", label="static rule")
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{t['kind']} on {t['node']} GPU {t['gpu']}", fontsize=10)
        ax.set_ylabel("score")
    axes[-1, 0].set_xlabel("minutes from the fault becoming visible")
    axes[0, 0].legend(loc="upper left", fontsize=8, ncol=5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(result: dict[str, Any], out_dir: str | pathlib.Path) -> list[pathlib.Path]:
    """Every picture the result has data for, as PNGs in ``out_dir`` (created)."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [
        lead_time(result, out / "lead_time.png"),
        healthy_margin(result, out / "healthy_margin.png"),
        score_traces(result, out / "score_traces.png"),
    ]
    return [p for p in written if p is not None]
