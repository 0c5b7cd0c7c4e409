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

What it reports is firing.py's; event rules' firings are event_firings.py's, each rule's per-target state
tracks.py's, and what the state says of one node or GPU node_view.py's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import structlog

from healer.rules import evaluate as evaluation
from healer.rules import event_firings, firing, node_view, ruleset, tracks
from healer.rules import state as fleet_state
from healer.schemas import events, fields, framecols, telemetry

log = structlog.get_logger(__name__)

# What the engine reports lives in rules/firing.py; the controller reads it under these names.
Status = firing.Status
Evidence = firing.Evidence
Key = firing.Key
FORGOTTEN = firing.FORGOTTEN
Firing = firing.Firing
Forgotten = firing.Forgotten


_INACTIVE, _PENDING, _FIRING, _RESOLVING = 0, 1, 2, 3


class Engine:
    """One RuleSet over one FleetState; ``state_options`` go to FleetState (gpus_per_node, capacity,
    stale_after_s, buckets_per_window, max_buckets)."""

    def __init__(self, rules: ruleset.RuleSet, **state_options: Any) -> None:
        self.rules = rules
        self.state = fleet_state.FleetState(rules, **state_options)
        self._tracks: dict[str, tracks.Track] = {}
        self._events = event_firings.EventFirings()
        self._restores: dict[Key, tuple[float, float]] = {}
        """Restored condition firings waiting for a frame: key → (since, the node's newest frame then)."""
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
        for key, active in self._events.active.items():
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
        self._events.active = {k: v for k, v in self._events.active.items() if k[0] in keep}
        self._events.repeats.retain(keep)
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
        per_rule = sum(
            a.nbytes for t in self._tracks.values() for a in (t.state, t.since, t.fired_at, t.cool_until)
        )
        return self.state.nbytes() + per_rule

    def ingest_event(self, event: events.NodeEvent) -> None:
        self._events.ingest(event, self.rules.event_rules)

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
                self._events.active.setdefault(
                    key, event_firings.EventFiring(since, last, dict(evidence), gpu_uuid)
                )
        else:
            self.state.flush()
            n = self.state.node_index(node)
            known = -math.inf if n is None else float(self.state.last_ts[n])
            self._restores[key] = (since, known)
        return True

    def summary(self, node: str, gpu: int | None, now: float, window_s: float = 600.0) -> dict[str, float]:
        """One GPU's telemetry as the rules read it (``node_view.summary``)."""
        return node_view.summary(self.state, node, gpu, now, window_s)

    def gpu_count(self, node: str) -> int:
        """The GPUs ``node`` has (``node_view.gpu_count``)."""
        return node_view.gpu_count(self.state, node)

    def release(self, rule_id: str, node: str, gpu: int | None, port: str | None = None) -> None:
        """Forget that a firing is active, without resolving it: its incident was closed by someone else
        (a recovery ladder that returned the node to service). The fault showing again fires anew."""
        key = (rule_id, node, gpu, port)
        self._events.active.pop(key, None)
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
            track = tracks.track_for(self._tracks, rule, tracks.width(rule, self.state), self.state)
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
            out += self._events.forget(name, now, reason, self.rules.by_id)
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
        out += self._events.evaluate(now, self.rules.event_rules, self.events_read, self.state)
        return out

    @property
    def events_waiting(self) -> bool:
        """Events queued that match an event rule and were not evaluated yet."""
        return bool(self._events.queued)

    def evaluate_arrivals(self, now: float) -> list[Firing]:
        """The events queued since the last evaluation, at once (the controller calls this as they
        arrive, between ticks): their ``fired`` and ``firing`` transitions, exactly what the next
        ``evaluate`` would have reported for them. Quiet periods and resolutions of event firings are
        left to ``evaluate``, which reports the ongoing ones every tick as before."""
        return self._events.fire_queued(now, self.state)

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
        width = tracks.width(rule, self.state)
        track = tracks.track_for(self._tracks, rule, width, self.state)
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
        width = tracks.width(rule, self.state)
        track = tracks.track_for(self._tracks, rule, width, self.state)
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
