"""The engine the controller drives: ingest telemetry and events, evaluate every rule for the fleet, and
report transitions with the evidence behind them.

Per (rule, node, GPU), (rule, node) or (rule, node, RDMA port), as the rule's scope says, a condition
rule is inactive → pending (condition true, waiting ``for``) →
firing → resolving (resolve condition true, waiting ``resolve.for``) → resolved. The default resolve
condition is "``when`` is definitely false", so a reading that goes missing neither fires nor resolves.
``cooldown`` keeps a resolved target from firing again too soon. A target whose firing ended while its
condition still held (an explicit resolve condition met first, or ``release``: a recovery ladder closed
its incident) fires again only after its condition has been seen false: the same old evidence (a counter
step still inside its window) never opens a second incident. Event rules fire at once on a matching
NodeEvent; with ``resolve: {for: ...}`` they resolve after that much quiet time (measured on the clock
``evaluate(now)`` runs on, never the event's own ``ts``), otherwise each event is a one-shot ``fired``.
All state lives in numpy arrays per rule, updated with masks, so a tick costs a few array operations per
rule whatever the fleet size; Python objects are only built for transitions. Between ticks,
``evaluate_arrivals`` fires the events queued since and ``evaluate_frames`` the rules without ``for`` on
only the nodes whose frames arrived since: the ``fired`` transitions the next ``evaluate`` would have
reported, earlier; ``evaluate`` reports them as ``firing`` after.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import structlog

from healer.rules import evaluate as evaluation
from healer.rules import repeats, ruleset
from healer.rules import state as fleet_state
from healer.schemas import events, fields, framecols, telemetry

log = structlog.get_logger(__name__)


class Status(enum.StrEnum):
    """Where a firing is in its life, declared once: code compares with the members, never the words."""

    FIRED = "fired"
    """Started firing at this evaluation (a new incident, or an event on an open one)."""
    FIRING = "firing"
    """Still firing (reported by every evaluation while it lasts)."""
    RESOLVED = "resolved"
    """Stopped firing (or its node was forgotten)."""


Evidence = dict[str, float | int | str | bool | None]
_INACTIVE, _PENDING, _FIRING, _RESOLVING = 0, 1, 2, 3
Key = tuple[str, str, int | None, str | None]
"""A firing's target: (rule id, node, GPU index or None, port name such as ``mlx5_0/1`` or None)."""
FORGOTTEN = "node forgotten: silent longer than its retention"
"""The evidence ``reason`` of a firing resolved because its node was forgotten (``forget_silent``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Firing:
    """One transition or ongoing firing of a rule on one target: a GPU, a node (``gpu`` and ``port``
    None) or an RDMA port of a port-scope rule (``port``: ``mlx5_0/1``)."""

    rule: ruleset.Rule
    node: str
    gpu: int | None
    status: Status
    since: float
    """When it fired (for ``resolved``: when the firing started)."""
    at: float
    evidence: Evidence
    gpu_uuid: str | None = None
    port: str | None = None

    @property
    def rule_id(self) -> str:
        return self.rule.id

    @property
    def key(self) -> Key:
        return (self.rule.id, self.node, self.gpu, self.port)


@dataclasses.dataclass(frozen=True, slots=True)
class Forgotten:
    """What ``forget_silent`` did: the nodes forgotten, and their firings, now resolved."""

    nodes: list[str]
    resolved: list[Firing]


@dataclasses.dataclass(slots=True)
class _Track:
    state: npt.NDArray[np.int8]
    since: npt.NDArray[np.float64]
    fired_at: npt.NDArray[np.float64]
    cool_until: npt.NDArray[np.float64]
    rearm: npt.NDArray[np.bool_]
    """Ended while the condition still held: may not start again until the condition is seen false."""
    mask_version: int = -1
    mask: npt.NDArray[np.bool_] | None = None
    busy: bool = True
    """Some target is pending, firing or resolving (False lets a quiet rule skip the state machine)."""


@dataclasses.dataclass(slots=True)
class _EventFiring:
    since: float
    last: float
    evidence: Evidence
    gpu_uuid: str | None


class Engine:
    """One RuleSet over one FleetState; ``state_options`` go to FleetState (gpus_per_node, capacity,
    stale_after_s, buckets_per_window, max_buckets)."""

    def __init__(self, rules: ruleset.RuleSet, **state_options: Any) -> None:
        self.rules = rules
        self.state = fleet_state.FleetState(rules, **state_options)
        self._tracks: dict[str, _Track] = {}
        self._queued: list[tuple[ruleset.Rule, events.NodeEvent]] = []
        self._active: dict[Key, _EventFiring] = {}
        self._restores: dict[Key, tuple[float, float]] = {}
        """Restored condition firings waiting for a frame: key → (since, the node's newest frame then)."""
        self._repeats = repeats.Counter()
        self.events_read = True
        """Whether the events stream's backlog has been read since this engine's owner began to lead.
        While False no event firing resolves: a quiet period is only quiet once the events that came
        while nobody led (a failover, a restart) have been seen. The controller clears it when it takes
        over and sets it when a pull finds the stream drained (``Ingest.pull_events``)."""
        self.rule_errors = 0
        """Rule evaluations that raised (logged with the rule id; the other rules still ran)."""

    # -- inputs
    def set_rules(self, rules: ruleset.RuleSet, now: float | None = None) -> list[Firing]:
        """Swap in a new RuleSet. Rules whose id, scope and conditions are unchanged keep their state;
        what a removed or changed rule had firing is returned as ``resolved`` (reason in the evidence),
        so the controller can close those incidents; a changed rule then starts afresh."""
        old = {r.id: r for r in self.rules.rules}
        new = {r.id: r for r in rules.rules}

        def same(r: ruleset.Rule) -> bool:
            o = old.get(r.id)
            return o is not None and (o.when_text, o.resolve_text, o.scope) == (
                r.when_text,
                r.resolve_text,
                r.scope,
            )

        keep = {r.id for r in rules.rules if same(r)}
        at = now if now is not None else float(np.max(self.state.last_ts[: self.state.n], initial=0.0))
        gone: list[Firing] = []
        reason: Evidence = {"reason": "rule removed or changed by a reload"}
        for rule_id, track in self._tracks.items():
            if rule_id in keep or rule_id not in old:
                continue
            n = min(self.state.n, track.state.shape[0])
            rows, cols = np.nonzero(track.state[:n] >= _FIRING)
            for i, j in zip(rows.tolist(), cols.tolist(), strict=True):
                rule = old[rule_id]
                gpu = j if rule.scope == fields.Scope.GPU else None
                since = float(track.fired_at[i, j])
                uuid = self.state.gpu_info[i].get(j, (None, None))[1] if gpu is not None else None
                name = self.state.names[i]
                port = self.state.ports.name(i, j) if rule.scope == fields.Scope.PORT else None
                gone.append(Firing(rule, name, gpu, Status.RESOLVED, since, at, dict(reason), uuid, port))
        for key, active in self._active.items():
            if key[0] not in new or not same(new[key[0]]):
                since = active.since
                gone.append(
                    Firing(
                        old[key[0]], key[1], key[2], Status.RESOLVED, since, at, dict(reason), active.gpu_uuid
                    )
                )
        self._tracks = {k: v for k, v in self._tracks.items() if k in keep}
        for track in self._tracks.values():
            track.mask_version = -1
        self._active = {k: v for k, v in self._active.items() if k[0] in keep}
        self._repeats.retain(keep)
        self.rules = rules
        self.state.set_rules(rules)
        return gone

    def decode(self, data: bytes) -> framecols.Frame:
        """A frame's bytes decoded with its GPU readings written straight into the fleet state's staging
        plane (``FleetState.decode``): ``ingest`` it next, or drop it; ``errors.DecodeError`` when bad."""
        return self.state.decode(data)

    def ingest(self, frame: telemetry.FrameView, at: float | None = None) -> None:
        """Queue a frame (cheap); the numpy work happens once per batch, at the next ``evaluate``.
        ``at``: receive time on the clock ``evaluate(now)`` uses (default ``frame.ts``)."""
        self.state.ingest(frame, at)

    def latest_power_limit(self, node: str, gpu: int) -> tuple[float, float] | None:
        """(frame ts, power limit in W) of the GPU in the node's newest frame; None while unknown (the
        node or GPU not reported, or its limit null)."""
        st = self.state
        st.flush()
        n = st.node_index(node)
        if n is None or not 0 <= gpu < st.gpus:
            return None
        limit = float(st.power_limit[n, gpu])
        return None if math.isnan(limit) else (float(st.frame_ts[n]), limit)

    def ingest_many(self, frames: Iterable[telemetry.FrameView], at: float | None = None) -> None:
        self.state.ingest_many(frames, at)

    def memory_bytes(self) -> int:
        """Fleet state plus per-rule hysteresis arrays."""
        tracks = sum(
            a.nbytes for t in self._tracks.values() for a in (t.state, t.since, t.fired_at, t.cool_until)
        )
        return self.state.nbytes() + tracks

    def ingest_event(self, event: events.NodeEvent) -> None:
        for rule in self.rules.event_rules:
            assert rule.on_event is not None
            if rule.on_event.matches(event):
                self._queued.append((rule, event))

    def restore(
        self,
        rule_id: str,
        node: str,
        gpu: int | None,
        *,
        since: float,
        last: float,
        evidence: Evidence,
        gpu_uuid: str | None = None,
        port: str | None = None,
    ) -> bool:
        """Take back a firing a previous process reported (a controller restart or a new leader), so it
        resolves by the rule's own terms instead of staying open forever. An event rule's firing is
        active again at once, quiet since ``last``. A condition rule's comes back as firing once the
        target reports again, with a frame received after this call (what this process knew of it
        before may predate the incident: a standby that lost the node's telemetry for a while must not
        resolve a fault it never saw on its old readings), then follows the resolve condition like any
        other. False if no loaded rule has that id. (An event firing restored at a takeover does not
        resolve before the events stream's backlog is read: ``events_read``.)"""
        rule = self.rules.by_id(rule_id)
        if rule is None:
            return False
        key = (
            rule_id,
            node,
            gpu if rule.scope == fields.Scope.GPU else None,
            port if rule.scope == fields.Scope.PORT else None,
        )
        if rule.scope == fields.Scope.PORT and key[3] is None:
            return False
        if rule.on_event is not None:
            if rule.resolve_for_s > 0:
                self._active.setdefault(key, _EventFiring(since, last, dict(evidence), gpu_uuid))
        else:
            self.state.flush()
            n = self.state.node_index(node)
            known = -math.inf if n is None else float(self.state.last_ts[n])
            self._restores[key] = (since, known)
        return True

    def summary(self, node: str, gpu: int | None, now: float, window_s: float = 600.0) -> dict[str, float]:
        """What the controller holds of one GPU's telemetry (the fields the loaded rules read): its newest
        readings (``latest.<field>``),
        for every field the rules keep a history of its average and maximum over ``window_s`` (where kept)
        (``avg_10m.<field>``, ``max_10m.<field>`` for 10 minutes), and the age of its newest frame. The
        telemetry part of a hardware-replacement bundle; empty for a node or GPU never seen."""
        st = self.state
        st.flush()
        n = st.node_index(node)
        if n is None or gpu is None or gpu >= st.gpus or not st.seen[n, gpu]:
            return {}
        # a frame received after ``now`` was taken (the flush above brought it in) is 0 s old, not negative
        out: dict[str, float] = {"age_s": round(max(0.0, now - float(st.last_ts[n])), 3)}
        for name, col in st.col.items():
            v = float(st.latest[col, n, gpu])
            if not math.isnan(v):
                out[f"latest.{name}"] = round(v, 3)
        span = f"{window_s / 60:g}m"
        for name in sorted(st.history):
            kept = set(st.history[name].rings)  # only what the rules' range functions need is kept
            for func, label, needs in (
                ("avg_over_time", "avg", {"sum", "cnt"}),
                ("max_over_time", "max", {"max"}),
            ):
                if not needs <= kept:
                    continue
                v = float(np.asarray(st.window(func, name, window_s, now))[n, gpu])
                if not math.isnan(v):
                    out[f"{label}_{span}.{name}"] = round(v, 3)
        return out

    def gpu_count(self, node: str) -> int:
        """The GPUs ``node`` has: those it ever reported, or its ``gpus_expected`` if more (a node-wide
        rule's threshold is a share of these); 0 for a node never seen."""
        st = self.state
        st.flush()
        n = st.node_index(node)
        if n is None:
            return 0
        expected = float(st.expected[n])
        seen = int(st.seen[n].sum())
        return max(seen, 0 if math.isnan(expected) else int(expected))

    def release(self, rule_id: str, node: str, gpu: int | None, port: str | None = None) -> None:
        """Forget that a firing is active, without resolving it: its incident was closed by someone else
        (a recovery ladder that returned the node to service). The fault showing again fires anew."""
        key = (rule_id, node, gpu, port)
        self._active.pop(key, None)
        self._restores.pop(key, None)
        track = self._tracks.get(rule_id)
        n = self.state.node_index(node)
        if track is None or n is None or n >= track.state.shape[0]:
            return
        col = gpu if gpu is not None and gpu < track.state.shape[1] else 0
        if port is not None:
            slot = self.state.ports.slot(n, port)
            if slot is None or slot >= track.state.shape[1]:
                return
            col = slot
        track.state[n, col] = _INACTIVE
        track.rearm[n, col] = True
        track.busy = True

    def _apply_restores(self) -> None:
        st = self.state
        for key, (since, known) in list(self._restores.items()):
            rule_id, node, gpu, port = key
            rule = self.rules.by_id(rule_id)
            n = st.node_index(node)
            if rule is None or rule.on_event is not None:
                del self._restores[key]
                continue
            if n is None or st.last_ts[n] <= known:
                continue  # not reported since the restore: wait
            if gpu is not None and (gpu >= st.gpus or not st.seen[n, gpu]):
                continue
            slot = st.ports.slot(n, port) if port is not None else None
            if port is not None and slot is None:
                continue  # the port has not been reported since: wait
            del self._restores[key]
            track = self._track(rule, self._width(rule))
            j = gpu if gpu is not None else slot if slot is not None else 0
            if track.state[n, j] == _INACTIVE:
                track.state[n, j], track.since[n, j], track.fired_at[n, j] = _FIRING, since, since
                track.busy = True

    def set_labels(self, node: str, labels: Mapping[str, str]) -> None:
        self.state.set_labels(node, labels)

    def set_anomaly_scores(self, node: str, scores: Mapping[int, float]) -> None:
        self.state.set_anomaly_scores(node, scores)

    def set_straggler_scores(self, node: str, scores: Mapping[int, float]) -> None:
        self.state.set_straggler_scores(node, scores)

    def forget_silent(self, now: float, retention_s: float) -> Forgotten:
        """Forget every node silent longer than ``retention_s`` (its state row is reused). What its
        rules had firing comes back as ``resolved`` with ``evidence["reason"] == FORGOTTEN``, so the
        caller can close those incidents without undoing anything on a node that left."""
        st = self.state
        out: list[Firing] = []
        reason: Evidence = {"reason": FORGOTTEN}
        names = st.silent_since(now - retention_s)
        for name in names:
            n = st.node_index(name)
            assert n is not None
            for rule_id, track in self._tracks.items():
                rule = self.rules.by_id(rule_id)
                if rule is None or n >= track.state.shape[0]:
                    continue
                for j in np.nonzero(track.state[n] >= _FIRING)[0].tolist():
                    gpu = j if rule.scope == fields.Scope.GPU else None
                    uuid = st.gpu_info[n].get(j, (None, None))[1] if gpu is not None else None
                    since = float(track.fired_at[n, j])
                    port = st.ports.name(n, j) if rule.scope == fields.Scope.PORT else None
                    out.append(Firing(rule, name, gpu, Status.RESOLVED, since, now, dict(reason), uuid, port))
                track.state[n], track.since[n], track.fired_at[n] = _INACTIVE, 0.0, 0.0
                track.rearm[n] = False
                track.cool_until[n] = -np.inf
            for key in [k for k in self._active if k[1] == name]:
                active = self._active.pop(key)
                rule = self.rules.by_id(key[0])
                if rule is not None:
                    out.append(
                        Firing(
                            rule,
                            name,
                            key[2],
                            Status.RESOLVED,
                            active.since,
                            now,
                            dict(reason),
                            active.gpu_uuid,
                        )
                    )
            for key in [k for k in self._restores if k[1] == name]:
                del self._restores[key]
            st.forget(name)
        return Forgotten(names, out)

    # -- evaluation
    def evaluate(self, now: float) -> list[Firing]:
        """Every rule over the whole fleet: new firings, ongoing firings and resolutions."""
        self.state.flush()
        if self._restores:
            self._apply_restores()
        self.state.clear_arrived()  # every row is read now
        ev = evaluation.Evaluator(self.state, now)
        out: list[Firing] = []
        for rule in self.rules.condition_rules:
            try:
                out += self._evaluate_rule(rule, ev, now)
            except Exception:  # a bug must cost one rule one tick, never the controller
                self.rule_errors += 1
                log.exception("rule_evaluation_failed", rule_id=rule.id)
        out += self._evaluate_events(now)
        return out

    @property
    def events_waiting(self) -> bool:
        """Events queued that match an event rule and were not evaluated yet."""
        return bool(self._queued)

    def evaluate_arrivals(self, now: float) -> list[Firing]:
        """The events queued since the last evaluation, at once (the controller calls this as they
        arrive, between ticks): their ``fired`` and ``firing`` transitions, exactly what the next
        ``evaluate`` would have reported for them. Quiet periods and resolutions of event firings are
        left to ``evaluate``, which reports the ongoing ones every tick as before."""
        return self._fire_queued(now)

    def flush(self) -> None:
        """The frames ingested so far into the fleet state now (``evaluate`` and ``evaluate_frames`` do
        it first; the caller may do it apart to time it apart)."""
        self.state.flush()

    def evaluate_frames(self, now: float) -> list[Firing]:
        """The rules without ``for`` (``RuleSet.prompt_rules``) on the nodes whose frames arrived since
        the last evaluation, at once (the controller calls this between ticks, as frames come in): the
        targets whose condition now holds fire, and their ``fired`` transitions are returned, exactly
        what the next ``evaluate`` would have reported for them (it reports them ``firing`` after).
        Pending and resolving targets, ``for`` and resolutions are left to ``evaluate``."""
        st = self.state
        st.flush()
        if self._restores:
            self._apply_restores()  # a restored firing fires nothing anew
        rows = st.take_arrived()
        if not len(rows):
            return []
        ev = evaluation.Evaluator(st, now, rows)
        out: list[Firing] = []
        for rule in self.rules.prompt_rules:
            try:
                out += self._fire_rows(rule, ev, now, rows)
            except Exception:  # as in ``evaluate``: one rule's bug costs that rule, never the rest
                self.rule_errors += 1
                log.exception("rule_evaluation_failed", rule_id=rule.id)
        return out

    def _evaluate_rule(self, rule: ruleset.Rule, ev: evaluation.Evaluator, now: float) -> list[Firing]:
        st = self.state
        n = st.n
        width = self._width(rule)
        track = self._track(rule, width)
        assert rule.when is not None
        value, evidence = ev.condition(rule.when, rule.when_text)
        value = np.broadcast_to(value, (n, width))
        if rule.scope == fields.Scope.GPU:
            exists = st.seen[:n]
        elif rule.scope == fields.Scope.PORT:
            exists = st.ports.known[:n]
        else:
            exists = np.ones((n, 1), dtype=bool)
        applies = exists if track.mask is None else exists & track.mask[:n]
        cond = (value == 1) & applies
        if not track.busy and not cond.any():
            return []  # the common case: nothing pending or firing, and nothing starts
        s, since = track.state[:n], track.since[:n]
        fired_at, cool, rearm = track.fired_at[:n], track.cool_until[:n], track.rearm[:n]
        rearm &= value != 0  # seen definitely false: armed again (a missing reading is not false)
        start = (s == _INACTIVE) & cond & ~rearm
        s[start], since[start] = _PENDING, now
        s[(s == _PENDING) & ~cond] = _INACTIVE
        promote = (s == _PENDING) & (now - since >= rule.for_s) & (now >= cool)
        s[promote], fired_at[promote] = _FIRING, now
        if rule.resolve_when is not None and (s >= _FIRING).any():
            rvalue, revidence = ev.condition(rule.resolve_when, rule.resolve_text)
            evidence = {**evidence, **revidence}
            rcond = np.broadcast_to(rvalue, (n, width)) == 1
        elif rule.resolve_when is not None:
            rcond = np.zeros((n, width), dtype=bool)
        else:
            rcond = value == 0
        rcond = rcond | ~applies
        resolving = (s == _FIRING) & rcond
        s[resolving], since[resolving] = _RESOLVING, now
        s[(s == _RESOLVING) & ~rcond] = _FIRING
        done = (s == _RESOLVING) & (now - since >= rule.resolve_for_s)
        s[done] = _INACTIVE
        rearm |= done & cond
        if rule.cooldown_s:
            cool[done] = now + rule.cooldown_s
        ongoing = ((s == _FIRING) | (s == _RESOLVING)) & ~promote
        track.busy = bool((s != _INACTIVE).any() or rearm.any())
        statuses: tuple[tuple[Status, npt.NDArray[np.bool_]], ...] = (
            (Status.FIRED, promote),
            (Status.FIRING, ongoing),
            (Status.RESOLVED, done),
        )
        return self._report(rule, statuses, evidence, fired_at, now, None)

    def _fire_rows(
        self, rule: ruleset.Rule, ev: evaluation.Evaluator, now: float, rows: npt.NDArray[np.intp]
    ) -> list[Firing]:
        """One rule without ``for`` on ``rows`` only: targets whose condition holds fire now, exactly as
        ``_evaluate_rule`` would start and promote them at this ``now`` (rearm and cooldown included);
        everything else of the state machine waits for the tick."""
        st = self.state
        width = self._width(rule)
        track = self._track(rule, width)
        assert rule.when is not None
        value, evidence = ev.condition(rule.when, rule.when_text)
        value = np.broadcast_to(value, (len(rows), width))
        if rule.scope == fields.Scope.GPU:
            exists = st.seen[rows]
        elif rule.scope == fields.Scope.PORT:
            exists = st.ports.known[rows]
        else:
            exists = np.ones((len(rows), 1), dtype=bool)
        cond = (value == 1) & (exists if track.mask is None else exists & track.mask[rows])
        rearm = track.rearm[rows]
        if rearm.any():
            rearm &= value != 0  # seen definitely false: armed again
            track.rearm[rows] = rearm
        s = track.state[rows]
        start = (s == _INACTIVE) & cond & ~rearm
        promote = ((s == _PENDING) | start) & cond & (now >= track.cool_until[rows])
        if not start.any() and not promote.any():
            return []
        since, fired_at = track.since[rows], track.fired_at[rows]
        s[start], since[start] = _PENDING, now
        s[promote], fired_at[promote] = _FIRING, now
        track.state[rows], track.since[rows], track.fired_at[rows] = s, since, fired_at
        track.busy = True
        return self._report(rule, ((Status.FIRED, promote),), evidence, fired_at, now, rows)

    def _report(
        self,
        rule: ruleset.Rule,
        statuses: tuple[tuple[Status, npt.NDArray[np.bool_]], ...],
        evidence: dict[str, Any],
        fired_at: npt.NDArray[np.float64],
        now: float,
        rows: npt.NDArray[np.intp] | None,
    ) -> list[Firing]:
        """The firings of each (status, mask) pair: masks, ``fired_at`` and ``evidence`` have one row per
        node row (``rows`` None) or per entry of ``rows``."""
        st = self.state
        out: list[Firing] = []
        names, info = st.names, st.gpu_info
        shape = fired_at.shape
        for status, mask in statuses:
            if not mask.any():
                continue
            local, cols = np.nonzero(mask)
            # Evidence for every firing slot at once: one fancy index per evidence value (values
            # compared per GPU inside a node-scope aggregation are not the node's evidence).
            port_hits = evidence.get(evaluation.PORT_HITS) if rule.scope != fields.Scope.PORT else None
            columns = {
                label: np.broadcast_to(arr, shape)[local, cols].tolist()
                for label, v in evidence.items()
                if label != evaluation.PORT_HITS
                and ((arr := np.asarray(v, dtype=np.float64)).ndim < 2 or arr.shape[1] in (1, shape[1]))
            }
            since_list = fired_at[local, cols].tolist()
            node_rows = local.tolist() if rows is None else rows[local].tolist()
            for k, (i, j) in enumerate(zip(node_rows, cols.tolist(), strict=True)):
                facts: Evidence = {
                    label: (None if math.isnan(xs[k]) else xs[k]) for label, xs in columns.items()
                }
                if port_hits is not None:  # the ports behind a port aggregation (rules/port_state.py)
                    facts["ports"] = st.ports.names(i, port_hits[local[k]])
                gpu = j if rule.scope == fields.Scope.GPU else None
                uuid = info[i].get(j, (None, None))[1] if gpu is not None else None
                port = st.ports.name(i, j) if rule.scope == fields.Scope.PORT else None
                out.append(Firing(rule, names[i], gpu, status, since_list[k], now, facts, uuid, port))
        return out

    def _width(self, rule: ruleset.Rule) -> int:
        """Targets per node row: the GPU slots, the port slots, or 1 (the node)."""
        if rule.scope == fields.Scope.GPU:
            return self.state.gpus
        return self.state.ports.slots if rule.scope == fields.Scope.PORT else 1

    def _track(self, rule: ruleset.Rule, width: int) -> _Track:
        st = self.state
        track = self._tracks.get(rule.id)
        if track is None or track.state.shape != (st.cap, width):
            fresh = _Track(
                np.zeros((st.cap, width), dtype=np.int8),
                np.zeros((st.cap, width)),
                np.zeros((st.cap, width)),
                np.full((st.cap, width), -np.inf),
                np.zeros((st.cap, width), dtype=bool),
            )
            if track is not None:  # the fleet grew: keep what we knew
                rows, cols = track.state.shape
                for name in ("state", "since", "fired_at", "cool_until", "rearm"):
                    getattr(fresh, name)[:rows, :cols] = getattr(track, name)
            track = self._tracks[rule.id] = fresh
        if track.mask_version != st.version:
            track.mask = None if rule.match.everything else self._mask(rule, width)
            track.mask_version = st.version
        return track

    def _mask(self, rule: ruleset.Rule, width: int) -> npt.NDArray[np.bool_]:
        st = self.state
        mask = np.zeros((st.cap, width), dtype=bool)
        for i, name in enumerate(st.names):
            if not rule.match.node_ok(name, st.labels[i]):
                continue
            if rule.scope != fields.Scope.GPU:
                models = [m for m, _ in st.gpu_info[i].values()]
                mask[i] = rule.match.model is None or any(rule.match.model_ok(m) for m in models)
            elif rule.match.model is None:
                mask[i] = True
            else:
                for g, (model, _) in st.gpu_info[i].items():
                    mask[i, g] = rule.match.model_ok(model)
        return mask

    def _evaluate_events(self, now: float) -> list[Firing]:
        out = self._fire_queued(now)
        rules = {r.id: r for r in self.rules.event_rules}
        reported = {f.key for f in out}
        for key, active in list(self._active.items()):
            rule = rules[key[0]]
            if self.events_read and now - active.last >= rule.resolve_for_s:
                del self._active[key]
                status: Status = Status.RESOLVED
            elif key in reported:
                continue
            else:
                status = Status.FIRING
            out.append(
                Firing(rule, key[1], key[2], status, active.since, now, active.evidence, active.gpu_uuid)
            )
        return out

    def _fire_queued(self, now: float) -> list[Firing]:
        out: list[Firing] = []
        queued, self._queued = self._queued, []
        for rule, event in queued:
            n = self.state.node_index(event.node)
            labels = self.state.labels[n] if n is not None else {}
            model = None
            if n is not None and event.gpu_index is not None:
                model = self.state.gpu_info[n].get(event.gpu_index, (None, None))[0]
            if not rule.match.node_ok(event.node, labels):
                continue
            if rule.match.model is not None and not rule.match.model_ok(model):
                continue
            gpu = event.gpu_index if rule.scope == fields.Scope.GPU else None
            evidence: Evidence = {"kind": event.kind, "xid": event.xid, "message": event.message}
            if event.gpu_index is not None:
                evidence["gpu_index"] = event.gpu_index
            evidence.update(_log_facts(event))
            if rule.on_event is not None and rule.on_event.repeat is not None:
                burst = self._repeats.observe(rule, event, gpu)
                if burst is None:
                    continue  # not a burst (yet)
                evidence.update(burst)
            key: Key = (rule.id, event.node, gpu, None)
            active = self._active.get(key)
            if active is not None:  # quiet periods run on the evaluator's clock, never the node's ts
                active.last, active.evidence = max(active.last, now), evidence
                out.append(
                    Firing(rule, event.node, gpu, Status.FIRING, active.since, now, evidence, event.gpu_uuid)
                )
                continue
            if rule.resolve_for_s > 0:
                self._active[key] = _EventFiring(now, now, evidence, event.gpu_uuid)
            out.append(Firing(rule, event.node, gpu, Status.FIRED, now, now, evidence, event.gpu_uuid))
        return out


def _log_facts(event: events.NodeEvent) -> Evidence:
    """What the kernel log added to an event (process, PCI address, decoded registers), for evidence."""
    facts: Evidence = {
        k: v
        for k, v in (("source", event.source), ("pid", event.pid), ("process", event.process),
                     ("pci_bus_id", event.pci_bus_id))
        if v is not None
    }  # fmt: skip
    facts.update({k: v for k, v in event.details.items() if k not in facts})
    return facts
