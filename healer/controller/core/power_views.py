"""What the power shell reads and shows, as pure functions: a budget's KV key and source, its GPUs'
readings from the newest frames, the readings a step still holds, the throughput a cap cost each job
(from the jobs' step times), and the live document the status page reads (``live_of``, written at most
every ``LIVE_EVERY_S`` unless it changed); ``DomainView`` is one budget now, as ``healer power status``
answers it. The shell that applies the budget's decisions is ``power_shell``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from healer import config
from healer.controller.failslow import steptimes
from healer.controller.incidents import shared_cause
from healer.controller.power import power_budget

KV_PREFIX = "power."
"""KV ``healer-state``: ``power.<key>.<value>``, one ``DomainState`` document per budget."""
TOLERANCE_W = 0.5


def kv_key(budget: config.PowerBudget) -> str:
    return KV_PREFIX + shared_cause.domain_node(budget.key, budget.value)


def source_of(b: config.PowerBudget) -> str:
    """Where a budget comes from, as people read it."""
    if b.breaker_kw is not None:
        return f"breaker {b.breaker_kw:g} kW x derating {b.derating:g} x gpu_share {b.gpu_share:g}"
    return f"contract {b.contract_kw:g} kW x gpu_share {b.gpu_share:g}"


def gpu_dicts(frame: object) -> list[dict[str, object]]:
    """What ``power_budget.readings_of`` reads of one frame's GPUs."""
    out = []
    for g in getattr(frame, "gpus", ()):
        out.append({
            "index": g.index, "power_w": g.power_w, "power_limit_w": g.power_limit_w,
            "power_min_w": getattr(g, "power_min_w", None), "power_default_w": g.power_default_w,
            "sm_clock_mhz": g.sm_clock_mhz,
        })  # fmt: skip
    return out


def mean_clock(frames: Mapping[str, Sequence[Mapping[str, object]]]) -> float | None:
    """The domain's GPUs' mean SM clock (MHz), or None without clock readings."""
    clocks = [
        float(v) for gs in frames.values() for g in gs if isinstance(v := g.get("sm_clock_mhz"), int | float)
    ]
    return round(sum(clocks) / len(clocks), 1) if clocks else None


KEPT = ("energy_start_j", "capped_at")
KEPT_PREFIXES = ("step_s_", "energy_start_j.", "energy_kwh.")
"""Evidence a step keeps from the incident's first cap."""
JOBS_MAX = 20
"""At most this many jobs' step times in a power-budget incident's evidence."""


def job_cost(
    steps: steptimes.StepTimes,
    running: Sequence[str],
    capped_at: float | None,
    evidence: Mapping[str, object],
) -> dict[str, float | int | str | bool | None]:
    """What a cap cost the domain's jobs, from their step reports (``healer.steps.<job>``): each job's
    median step time in its last window before the first cap (``step_s_before.<job>``), and in its last
    window that began after it (``step_s_capped.<job>``; ``step_s_cost.<job>``: capped / before - 1)."""
    out: dict[str, float | int | str | bool | None] = {}
    for job in sorted(set(running))[:JOBS_MAX]:
        js = steps.jobs.get(job)
        if js is None or js.current_s is None:
            continue
        before = evidence.get(f"step_s_before.{job}")
        if capped_at is None:
            out[f"step_s_before.{job}"] = round(js.current_s, 4)  # the first cap: the last window before
        elif isinstance(before, int | float) and js.started - steptimes.STEP_WINDOW_S >= capped_at:
            out[f"step_s_capped.{job}"] = round(js.current_s, 4)
            out[f"step_s_cost.{job}"] = round(js.current_s / float(before) - 1.0, 4)
    return out


def planned(
    readings: Sequence[power_budget.Reading], state: power_budget.DomainState
) -> list[power_budget.Reading]:
    """Dry-run / observe: each GPU as if the limit healer last asked for held (nothing changed it)."""
    out = []
    for r in readings:
        cap = state.capped_w.get(power_budget.key_of(r.node, r.gpu))
        if cap is None or cap >= r.limit_w:
            out.append(r)
        else:
            out.append(dataclasses.replace(r, limit_w=cap, power_w=min(r.power_w, cap)))
    return out


LIVE_KEY = "live"
"""The KV document's view of the domain now (its live draw against the budget in force, the phase, GPUs
counted and capped, the open incident, ``at``): what the status page shows (docs/ui.md)."""
LIVE_DELTA = 0.01
"""The live view is written again when the draw moved by more than this share of the budget in force ..."""
LIVE_EVERY_S = 30.0
"""... when anything else in it changed, or when this long has passed with any change at all."""


def live_of(view: DomainView, now: float) -> dict[str, object]:
    """The ``live`` part of a budget's KV document, from the leader's view at its last step."""
    return {
        "draw_w": round(view.draw_w, 1), "budget_w": round(view.budget.gpu_budget_w, 1),
        "budget_in_force_w": round(view.budget_w, 1), "phase": view.phase.name.lower(), "gpus": view.gpus,
        "members": len(view.members), "capped_gpus": len(view.state.capped_w),
        "incident_id": view.incident_id, "at": round(now, 3),
    }  # fmt: skip


def live_changed(prev: Mapping[str, object] | None, new: Mapping[str, object]) -> bool:
    """Whether the live view is worth a KV write (``LIVE_DELTA``, ``LIVE_EVERY_S``)."""
    if prev is None:
        return True
    keys = ("phase", "capped_gpus", "budget_in_force_w", "budget_w", "incident_id", "gpus", "members")
    if any(prev.get(k) != new.get(k) for k in keys):
        return True

    def num(doc: Mapping[str, object], k: str) -> float:
        v = doc.get(k)
        return float(v) if isinstance(v, int | float) else 0.0

    if abs(num(new, "draw_w") - num(prev, "draw_w")) > LIVE_DELTA * max(num(new, "budget_in_force_w"), 1.0):
        return True
    return num(new, "draw_w") != num(prev, "draw_w") and num(new, "at") - num(prev, "at") >= LIVE_EVERY_S


@dataclasses.dataclass(frozen=True, slots=True)
class DomainView:
    """One budget now (``healer power status``)."""

    budget: config.PowerBudget
    members: tuple[str, ...]
    gpus: int
    draw_w: float
    budget_w: float
    phase: power_budget.Phase
    state: power_budget.DomainState
    incident_id: str | None
