"""The report's finer figures (docs/archive.md, "Definitions"): GPU-hours lost by scheduler state and by
pool or domain label, repair time by action and by ladder rung, time between failures, the domains'
shared-cause incidents, the power budgets' caps and energy, and the repeat offenders' map.

``figures.build`` calls these with what it has already read; each reads the archive only for what the
incidents table does not hold (the actions' kinds, a shared-cause incident's domain, a power episode's
largest cap).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import orjson

from healer import actions
from healer.archive import store
from healer.schemas import incidents

NOT_CONTAINED: Final = "in service, not contained"
"""Time between an incident's opening and its containment (or all of it, for one never contained: observe
or dry-run mode, a rule without a containing action): the GPU was suspect but still scheduled."""
RUNGS: Final = actions.RUNGS
"""The recovery ladder's rungs (the action registry's live list, in its order: reset_gpu, reset_port,
reboot_node); the deepest one run names the repair."""
NO_RUNG: Final = "no rung"
REPLACED: Final = "hardware_replacement"
POWER_RULE: Final = "power-budget"
"""A power budget's episode (docs/power-budgets.md): its GPUs were capped, not out of service."""


def _state_of(kind: str) -> str:
    spec = actions.CATALOG.get(kind)
    if spec is None:
        return kind
    if spec.caps_power:
        return "power-capped"
    return "drained" if spec.drains else "cordoned"


def containing_kinds(archive: store.Archive, ids: set[str]) -> dict[str, str]:
    """incident id -> the kind of its first containing action that took effect."""
    took = tuple(sorted(str(s) for s in incidents.TOOK_EFFECT))
    marks = ",".join("?" * len(took))
    out: dict[str, str] = {}
    for r in archive.rows(
        f"SELECT incident_id, kind FROM actions WHERE status IN ({marks}) ORDER BY at, idx", took
    ):
        if r["incident_id"] in ids and r["kind"] in store.CONTAINS and r["incident_id"] not in out:
            out[r["incident_id"]] = r["kind"]
    return out


def by_state(
    pieces: Iterable[tuple[Mapping[str, Any], float, float, int]], kinds: Mapping[str, str]
) -> dict[str, float]:
    """GPU-hours lost by what the scheduler did with the GPU meanwhile: ``NOT_CONTAINED`` until the
    incident's containment, then drained, cordoned or power-capped as its first containing action."""
    out: dict[str, float] = collections.defaultdict(float)
    for row, start, end, gpus in pieces:
        contained = row["contained_at"] if row["contained_at"] is not None else math.inf
        if start < contained:
            out[NOT_CONTAINED] += gpus * (min(end, contained) - start) / 3600
        if end > contained:
            state = _state_of(kinds.get(row["incident_id"], "cordon"))
            out[state] += gpus * (end - max(start, contained)) / 3600
    return dict(sorted(out.items()))


def by_label(
    pieces: Iterable[tuple[Mapping[str, Any], float, float, int]], keys: Sequence[str]
) -> dict[str, Any]:
    """GPU-hours lost per value of each label key in ``keys`` (a pool, a rack: the labels the controller
    copies from the scheduler onto each incident); incidents without the label under ``(none)``."""
    out: dict[str, dict[str, float]] = {k: collections.defaultdict(float) for k in keys}
    for row, start, end, gpus in pieces:
        labels = orjson.loads(row["labels"])
        for k in keys:
            out[k][str(labels.get(k, "(none)"))] += gpus * (end - start) / 3600
    return {k: dict(sorted(v.items())) for k, v in out.items() if set(v) != {"(none)"}}


def availability_by_label(
    lost: Mapping[str, Mapping[str, float]], sizes: Mapping[str, Mapping[str, int]], window_s: float
) -> dict[str, dict[str, float]]:
    """The share of each sized pool's (or domain's) GPU-hours in service over the window: ``sizes`` gives
    its GPUs (``{"pool": {"a": 64}}``), ``lost`` its GPU-hours lost (``by_label``; none lost: 1.0)."""
    out: dict[str, dict[str, float]] = {}
    for key, values in sizes.items():
        for value, gpus in values.items():
            if gpus > 0 and window_s > 0:
                share = lost.get(key, {}).get(value, 0.0) / (gpus * window_s / 3600)
                out.setdefault(key, {})[value] = max(0.0, 1 - share)
    return out


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest rank: the smallest value with at least ``p`` % of the values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(p / 100 * len(ordered)), 1) - 1]


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Count, p50 and p90 (nearest rank; None without values)."""
    return {"count": len(values), "p50_s": percentile(values, 50), "p90_s": percentile(values, 90)}


def repair_by(
    archive: store.Archive, resolved: Sequence[Mapping[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """Time to repair of the window's resolved fault incidents, by each action kind that took effect in
    them, and by the deepest ladder rung run (``RUNGS``; a replacement when the ladder ended in one)."""
    ids = {r["incident_id"] for r in resolved}
    took = tuple(sorted(str(s) for s in incidents.TOOK_EFFECT))
    marks = ",".join("?" * len(took))
    done: dict[str, list[str]] = collections.defaultdict(list)
    for a in archive.rows(
        f"SELECT incident_id, kind FROM actions WHERE status IN ({marks}) ORDER BY at, idx", took
    ):
        if a["incident_id"] in ids:
            done[a["incident_id"]].append(a["kind"])
    actions_: dict[str, list[float]] = collections.defaultdict(list)
    rungs: dict[str, list[float]] = collections.defaultdict(list)
    for r in resolved:
        repair = r["resolved_at"] - r["opened_at"]
        kinds = done.get(r["incident_id"], [])
        for kind in dict.fromkeys(kinds):
            actions_[kind].append(repair)
        ran = [k for k in kinds if k in RUNGS]
        rung = REPLACED if r["outcome"] == REPLACED else max(ran, key=RUNGS.index) if ran else NO_RUNG
        rungs[rung].append(repair)
    return {
        "by_action": [{"action": k, **spread(v)} for k, v in sorted(actions_.items())],
        "by_rung": [{"rung": k, **spread(v)} for k, v in sorted(rungs.items())],
    }


def between_failures(opened: Iterable[Mapping[str, Any]], fleet_gpus: int, window_h: float) -> dict[str, Any]:
    """Time between failures: per GPU (node and GPU index; a node's own incidents as the node), the gaps
    between the opening of its consecutive fault incidents in ``opened``; and the fleet's mean, its GPU-hours
    over its incidents."""
    times: dict[tuple[str, int | None], list[float]] = collections.defaultdict(list)
    for r in opened:
        times[(r["node"], r["gpu_index"])].append(r["opened_at"])
    gaps = [b - a for ts in times.values() for a, b in zip(sorted(ts), sorted(ts)[1:], strict=False)]
    count = sum(len(ts) for ts in times.values())
    return {
        "per_gpu": spread(gaps),
        "fleet_mtbf_gpu_hours": fleet_gpus * window_h / count if count and fleet_gpus else None,
    }


def _latest_bodies(archive: store.Archive, ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """incident id -> its events' ``data``, in time order."""
    out: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        for r in archive.rows(
            f"SELECT incident_id, body FROM events WHERE incident_id IN ({','.join('?' * len(chunk))})"
            " ORDER BY time, stream_seq",
            tuple(chunk),
        ):
            data = orjson.loads(r["body"]).get("data")
            if isinstance(data, dict):
                out[r["incident_id"]].append(data)
    return out


def shared_causes(archive: store.Archive, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The window's shared-cause incidents (docs/controller.md): the suspected domain and its members."""
    bodies = _latest_bodies(archive, [r["incident_id"] for r in rows])
    out = []
    for r in rows:
        found = (d["domain"] for d in reversed(bodies.get(r["incident_id"], [])) if d.get("domain"))
        domain: dict[str, Any] = next(found, {})
        out.append(
            {
                "incident_id": r["incident_id"], "domain": r["node"], "suspected": domain.get("suspected"),
                "member_count": domain.get("member_count"), "size": domain.get("size"),
                "opened_at": r["opened_at"], "resolved_at": r["resolved_at"], "outcome": r["outcome"],
            }
        )  # fmt: skip
    return out


def power_budgets(
    archive: store.Archive, rows: Sequence[Mapping[str, Any]], end: float
) -> list[dict[str, Any]]:
    """The window's power-budget episodes: how long, the most GPUs capped at once, the domain's energy
    over the episode (``energy_kwh`` of its latest event, where the controller meters energy)."""
    bodies = _latest_bodies(archive, [r["incident_id"] for r in rows])
    out = []
    for r in rows:
        evidence = orjson.loads(r["evidence"])
        caps = [d.get("evidence", {}).get("capped_gpus") for d in bodies.get(r["incident_id"], [])]
        capped = [c for c in caps if isinstance(c, int | float)]
        out.append(
            {
                "incident_id": r["incident_id"], "domain": evidence.get("domain", r["node"]),
                "opened_at": r["opened_at"], "resolved_at": r["resolved_at"],
                "capped_s": min(r["resolved_at"] or end, end) - r["opened_at"],
                "max_capped_gpus": max(capped) if capped else None, "energy_kwh": evidence.get("energy_kwh"),
                "budget_w": evidence.get("budget_w"),
            }
        )  # fmt: skip
    return out


def repeat_map(
    groups: Mapping[tuple[str, int | None], Sequence[Any]], nodes: Iterable[str]
) -> list[dict[str, Any]]:
    """For each node with a repeat offender: its fault incidents in the repeat window per GPU (``node`` for
    the node's own), the page's map of repeat offenders."""
    wanted = set(nodes)
    counts: dict[str, dict[str, int]] = collections.defaultdict(dict)
    for (node, gpu), members in groups.items():
        if node in wanted:
            counts[node]["node" if gpu is None else str(gpu)] = len(members)
    return [{"node": n, "counts": dict(sorted(c.items()))} for n, c in sorted(counts.items())]
