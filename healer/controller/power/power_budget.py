"""Power budgets per failure domain (#30): the decision, pure.

A rack, PDU or row has a budget (``controller.power_budgets``; a breaker's rating x derating, or a
contract). ``step`` looks at one domain's live GPU readings against it once per tick and returns the
new state and the power-limit changes; it changes nothing itself (the shell sends the changes through
the usual gates, fencing and the breaker's counting, and keeps ``DomainState`` in KV so a new leader
carries on).

- **Over.** The GPUs' summed power over the (effective) budget for ``hold_s`` → caps: limits that bring
  the domain to ``hysteresis_percent`` under the budget, never below a GPU's minimum limit and never
  above what it is already limited to. ``hold_s`` is the longest the domain may stay over: it counts
  from the reading before the first one over (``step``'s ``since``: it went over at some moment after
  it), and the caps are decided early by the time limits take to show in the readings (``lead_s``: the
  lag of the domain's last cap step, learned in ``DomainState.lag_s``; ``FIRST_LAG_S`` before one was
  measured; at most half the hold): decided as the hold ends, they would hold only a frame after it.
  ``proportional``: every GPU sheds the same share of what it draws above its minimum; ``priority``:
  the lowest rank is taken to its minimum first, then the next. A GPU drawing no more than its
  minimum (idle) is left alone: it would shed nothing. A GPU's rank (``rank_of``) is its job's
  (``controller.power_priority``: the job's Slurm QOS, else partition, else Kubernetes priority
  class), else its node's label (the budget's ``priority_label`` / ``priorities``), else the
  declared default.
- **Headroom.** Under the budget by the hysteresis, with the next step of every GPU its cap holds
  now assumed fully drawn, for ``restore_after_s`` → each capped GPU rises by
  ``restore_step_percent`` of its default limit; a GPU back at the limit it had before healer
  capped it is released. A step that would take the domain back over waits, so a steady load sees
  no cap / restore cycles.
- **Demand response.** ``shed_to_w`` until ``shed_until`` replaces the budget when lower (a utility's
  demand-response request: ``healer.power.shed``, ``healer power shed``); when it ends the normal
  restore follows.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence

from healer import config
from healer.controller.inventory import jobs

RULE_ID = "power-budget"
"""The rule id of a domain's power-budget incident (one per cap episode; ``power_shell`` opens it)."""
AT_LIMIT = 0.97
"""A GPU drawing this fraction of its limit or more is held by it (its demand may be higher)."""
FIRST_LAG_S = 2.0
"""The lag assumed before a domain's first cap step was measured: with agents at their default 1 Hz and
a 1 s tick, up to a frame until a limit sent shows in a reading, and up to a tick until a step sees it
(the domain's first over reading was seen up to a tick late as well)."""
TOLERANCE_W = 0.5
"""A reading within this of the limit healer set shows that limit (NVML works in milliwatts)."""

Gpu = tuple[str, int]
"""(node, GPU index)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Reading:
    """One GPU of the domain, from its newest frame."""

    node: str
    gpu: int
    power_w: float
    limit_w: float
    min_w: float
    default_w: float
    rank: int = 0
    """Priority (higher is capped later): ``rank_of`` its job or its node."""
    ranked_by: str = ""
    """What gave the rank (``job 41: partition train``, ``node label priority=high``, ``default``)."""


class Phase(enum.IntEnum):
    UNDER = 0
    """Within the budget; nothing capped."""
    OVER = 1
    """Over the budget, waiting out ``hold_s``."""
    CAPPED = 2
    """healer holds some limits of the domain down."""


@dataclasses.dataclass(frozen=True, slots=True)
class DomainState:
    """What must survive failover (a KV document per domain)."""

    over_since: float | None = None
    headroom_since: float | None = None
    last_change: float | None = None
    original_w: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """``"<node>/<gpu>"`` → the limit the GPU had before healer first capped it."""
    capped_w: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """``"<node>/<gpu>"`` → the limit healer set last."""
    cycles: tuple[float, ...] = ()
    """When each cap cycle began (a cycle: from first cap to full release)."""
    shed_to_w: float | None = None
    shed_until: float | None = None
    sent_at: float | None = None
    """When the last cap step was decided, until the readings show every limit it lowered."""
    lag_s: float | None = None
    """How long the last measured cap step took from its decision to a step whose readings showed its
    limits in force (``lead_s``)."""

    def dump(self) -> dict[str, object]:
        return {
            "over_since": self.over_since, "headroom_since": self.headroom_since,
            "last_change": self.last_change, "original_w": dict(self.original_w),
            "capped_w": dict(self.capped_w), "cycles": list(self.cycles), "shed_to_w": self.shed_to_w,
            "shed_until": self.shed_until, "sent_at": self.sent_at, "lag_s": self.lag_s,
        }  # fmt: skip

    @classmethod
    def load(cls, doc: Mapping[str, object]) -> DomainState:
        def num(name: str) -> float | None:
            v = doc.get(name)
            return float(v) if isinstance(v, (int, float)) else None

        def watts(name: str) -> dict[str, float]:
            v = doc.get(name)
            if not isinstance(v, Mapping):
                return {}
            return {str(k): float(w) for k, w in v.items() if isinstance(w, (int, float))}

        cycles = doc.get("cycles")
        return cls(
            over_since=num("over_since"), headroom_since=num("headroom_since"),
            last_change=num("last_change"), original_w=watts("original_w"), capped_w=watts("capped_w"),
            cycles=tuple(float(c) for c in cycles if isinstance(c, (int, float)))
            if isinstance(cycles, list) else (),
            shed_to_w=num("shed_to_w"), shed_until=num("shed_until"), sent_at=num("sent_at"),
            lag_s=num("lag_s"),
        )  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    node: str
    gpu: int
    from_w: float
    to_w: float
    release: bool = False
    """Back to the limit the GPU had before: ``restore_power_limit``, not a new cap."""

    @property
    def kind(self) -> str:
        return "restore_power_limit" if self.release else "power_limit"


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    state: DomainState
    changes: tuple[Change, ...]
    phase: Phase
    total_w: float
    budget_w: float
    """The budget in force (a demand-response shed when lower)."""


def key_of(node: str, gpu: int) -> str:
    return f"{node}/{gpu}"


def budget_now(budget: config.PowerBudget, state: DomainState, now: float) -> float:
    """The budget in force: the configured one, or a running demand-response shed when lower."""
    base = budget.gpu_budget_w
    if state.shed_to_w is not None and state.shed_until is not None and now < state.shed_until:
        return min(base, state.shed_to_w)
    return base


def lead_s(budget: config.PowerBudget, state: DomainState) -> float:
    """How long before the hold time ends a cap step is decided, so that its limits hold by then: the
    lag the domain's last cap step took to show in its readings (``FIRST_LAG_S`` before one was
    measured), at most half the hold, so a spike shorter than that is never capped."""
    lag = state.lag_s if state.lag_s is not None else FIRST_LAG_S
    return min(lag, budget.hold_s / 2.0)


def measured(readings: Sequence[Reading], state: DomainState, now: float) -> DomainState:
    """The state with the last cap step's lag once the readings show every limit healer holds (a GPU
    without a reading now is not waited for)."""
    if state.sent_at is None:
        return state
    shown = [r for r in readings if key_of(r.node, r.gpu) in state.capped_w]
    if not shown or any(r.limit_w > state.capped_w[key_of(r.node, r.gpu)] + TOLERANCE_W for r in shown):
        return state
    return dataclasses.replace(state, sent_at=None, lag_s=round(max(0.0, now - state.sent_at), 3))


def shed(state: DomainState, to_w: float, until: float) -> DomainState:
    """A demand-response request: hold ``to_w`` until ``until``."""
    return dataclasses.replace(state, shed_to_w=to_w, shed_until=until)


def step(
    readings: Sequence[Reading],
    budget: config.PowerBudget,
    state: DomainState,
    now: float,
    since: float | None = None,
) -> Decision:
    """One tick of one domain (see the module docstring). ``since``: when the domain was last read before
    ``now`` (None: not known). A domain first read over now went over at some moment after it, so its
    hold counts from then: over a tick's gap the reading that showed it over was already that old."""
    if state.shed_until is not None and now >= state.shed_until:
        state = dataclasses.replace(state, shed_to_w=None, shed_until=None)
    state = measured(readings, state, now)
    limit_w = budget_now(budget, state, now)
    total = sum(r.power_w for r in readings)
    margin = budget.hysteresis_percent / 100.0
    if total > limit_w:
        first = now if since is None else min(since, now)
        over_since = state.over_since if state.over_since is not None else first
        state = dataclasses.replace(state, over_since=over_since, headroom_since=None)
        if now - over_since < budget.hold_s - lead_s(budget, state):
            return Decision(state, (), Phase.OVER if not state.capped_w else Phase.CAPPED, total, limit_w)
        target = limit_w * (1.0 - margin)
        changes = _caps(readings, total - target, budget)
        return _applied(state, changes, readings, now, total, limit_w)
    state = dataclasses.replace(state, over_since=None)
    if not state.capped_w:
        return Decision(dataclasses.replace(state, headroom_since=None), (), Phase.UNDER, total, limit_w)
    changes = _restores(readings, budget, state, limit_w * (1.0 - margin), total)
    if not changes:
        state = dataclasses.replace(state, headroom_since=None)
        return Decision(state, (), Phase.CAPPED, total, limit_w)
    since = state.headroom_since if state.headroom_since is not None else now
    state = dataclasses.replace(state, headroom_since=since)
    last = state.last_change if state.last_change is not None else since
    if now - since < budget.restore_after_s or now - last < budget.restore_after_s:
        return Decision(state, (), Phase.CAPPED, total, limit_w)
    return _applied(state, changes, readings, now, total, limit_w)


def _caps(readings: Sequence[Reading], shed_w: float, budget: config.PowerBudget) -> list[Change]:
    """New limits shedding ``shed_w`` from what the GPUs draw, by the budget's policy."""
    if shed_w <= 0:
        return []
    want: dict[Gpu, float] = {}
    groups: list[list[Reading]] = [list(readings)]
    if budget.policy == "priority":
        ranks = sorted({r.rank for r in readings})
        groups = [[r for r in readings if r.rank == k] for k in ranks]
    left = shed_w
    for group in groups:
        spare = sum(max(0.0, r.power_w - r.min_w) for r in group)
        if spare <= 0:
            continue
        share = min(1.0, left / spare)
        for r in group:
            want[(r.node, r.gpu)] = r.power_w - share * max(0.0, r.power_w - r.min_w)
        left -= share * spare
        if left <= 1e-9:
            break
    out = []
    for r in readings:
        w = want.get((r.node, r.gpu))
        if w is None or r.power_w <= r.min_w:
            continue  # an idle GPU sheds nothing: a limit would only hold back the job it gets next
        w = max(r.min_w, round(w, 1))
        if w < r.limit_w - 0.5:
            out.append(Change(r.node, r.gpu, r.limit_w, w))
    return out


def _restores(
    readings: Sequence[Reading],
    budget: config.PowerBudget,
    state: DomainState,
    ceiling_w: float,
    total: float,
) -> list[Change]:
    """The next restore step of every capped GPU, if the domain stays under ``ceiling_w`` with every
    raised GPU that its cap holds now (``AT_LIMIT``) drawing its whole new limit.

    A step rises from the budget's own cap (``capped_w``), not from the limit the GPU reads when that is
    lower: another of healer's holders (a hot GPU's incident) holds it there, the agent keeps the tighter
    of the two, and the budget's steps go on to its release as if alone. A GPU reading more than the
    budget's cap (the cap failed) steps from what it reads."""
    out: list[Change] = []
    rise = 0.0
    for r in readings:
        k = key_of(r.node, r.gpu)
        own = state.capped_w.get(k)
        if own is None:
            continue
        original = state.original_w.get(k, r.default_w)
        base = max(own, r.limit_w)
        to = min(original, base + budget.restore_step_percent / 100.0 * r.default_w)
        if r.power_w >= r.limit_w * AT_LIMIT:  # held by its cap: it will draw the whole step
            rise += max(0.0, to - r.power_w)
        out.append(Change(r.node, r.gpu, base, round(to, 1), release=to >= original - 0.5))
    if total + rise > ceiling_w:
        return []
    return out


def _applied(
    state: DomainState,
    changes: Sequence[Change],
    readings: Sequence[Reading],
    now: float,
    total: float,
    limit_w: float,
) -> Decision:
    if not changes:
        return Decision(state, (), Phase.CAPPED if state.capped_w else Phase.OVER, total, limit_w)
    original = dict(state.original_w)
    capped = dict(state.capped_w)
    cycles = state.cycles
    lowered = any(not c.release and c.to_w < c.from_w for c in changes)
    if not capped:
        cycles = (*cycles, now)
    for c in changes:
        k = key_of(c.node, c.gpu)
        if c.release:
            capped.pop(k, None)
            original.pop(k, None)
            continue
        original.setdefault(k, c.from_w)
        capped[k] = c.to_w
    state = dataclasses.replace(
        state, original_w=original, capped_w=capped, cycles=cycles, last_change=now, over_since=None,
        sent_at=now if lowered else None,
    )  # fmt: skip
    return Decision(state, tuple(changes), Phase.CAPPED if capped else Phase.UNDER, total, limit_w)


JobAt = Mapping[Gpu, tuple[str, jobs.JobInfo]]
"""(node, GPU) → the job running there and what its scheduler says it is (``JobIndex.info_at``)."""


def rank_of(
    job: tuple[str, jobs.JobInfo] | None,
    node_labels: Mapping[str, str],
    budget: config.PowerBudget,
    table: config.PowerPriority,
) -> tuple[int, str]:
    """A GPU's rank under ``policy: priority`` (higher: capped later), and what gave it: the job on it,
    by its QOS, else its partition, else its priority class, as ``table`` lists them; else its node's
    ``priority_label`` as the budget's ``priorities`` list it; else ``table.default``. The job wins
    over the node: a node's label says what usually runs there, the scheduler what runs now."""
    if job is not None:
        name, info = job
        for what, value, ranks in (
            ("qos", info.qos, table.qos),
            ("partition", info.partition, table.partition),
            ("priority class", info.priority_class, table.priority_class),
        ):
            if value is not None and value in ranks:
                return ranks[value], f"job {name}: {what} {value}"
    label = node_labels.get(budget.priority_label)
    if label is not None and label in budget.priorities:
        return budget.priorities[label], f"node label {budget.priority_label}={label}"
    return table.default, "default"


def readings_of(
    frames: Mapping[str, Sequence[Mapping[str, object]]],
    members: Sequence[str],
    labels: Mapping[str, Mapping[str, str]],
    budget: config.PowerBudget,
    table: config.PowerPriority | None = None,
    job_at: JobAt | None = None,
) -> list[Reading]:
    """The domain's GPUs from each member node's newest GpuSample dicts (a GPU without a power reading,
    limit or minimum is left out: it can be neither counted nor capped), each ranked by ``rank_of`` its
    job (``job_at``) or its node's labels."""
    table = table if table is not None else config.PowerPriority()
    job_at = job_at if job_at is not None else {}
    out = []
    for node in members:
        node_labels = labels.get(node, {})
        for g in frames.get(node, ()):
            vals = [g.get(n) for n in ("power_w", "power_limit_w", "power_min_w", "power_default_w")]
            idx = g.get("index")
            if not isinstance(idx, int) or not all(isinstance(v, (int, float)) for v in vals):
                continue
            p, lim, lo, dflt = (float(v) for v in vals)  # type: ignore[arg-type]
            rank, by = rank_of(job_at.get((node, idx)), node_labels, budget, table)
            out.append(Reading(node, idx, p, lim, lo, dflt, rank, by))
    return out
