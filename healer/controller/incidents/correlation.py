"""Correlation, as pure functions (no I/O): one incident per fault.

Whether a new firing is another signal of a fault that already has an incident (the same GPU, the same
RDMA port for a port-scope rule, or the same node for a node-scope rule, within ``correlate_window_s``),
and what joining it changes (``correlate``, ``join``): its actions the union of the rules' actions
(``merge``, ``union``), its evidence every signal's (``evidence_of``).
**Node-wide faults**: a GPU rule with ``node_wide`` opens a GPU incident that other GPUs of its node
firing rules of the same group join; once ``node_wide.threshold`` of the node's GPUs did, it is one node
incident (no GPU) with per-GPU evidence, and its per-GPU actions (a power cap) are planned, and undone
as each GPU's firing resolves, for each GPU that fired (``gpu_restores``).

Nothing here changes an incident: ``join`` returns the change and the shell
(``incident_shell.apply_join``) applies it; what a firing does to its own incident is in ``decide``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from healer import actions
from healer.controller.incidents import book
from healer.rules import engine, ruleset
from healer.schemas import fields, incidents

RuleOf = Callable[[str], ruleset.Rule | None]
"""Finds a loaded rule by id (``Engine.rules.by_id``)."""


def no_rule(rule_id: str) -> ruleset.Rule | None:
    return None


# -- correlation: one incident per fault --------------------------------------------------------------
def holds(rule: ruleset.Rule) -> bool:
    """A firing of this rule holds its incident open until it resolves. An event rule without
    ``resolve`` never resolves (each event fires anew): its signal is evidence only."""
    return not (rule.on_event is not None and rule.resolve_for_s <= 0)


def signal_of(f: engine.Firing, now: float) -> book.Signal:
    return book.Signal(
        rule_id=f.rule.id, gpu_index=f.gpu, gpu_uuid=f.gpu_uuid, port=f.port, since=now,
        last_seen_firing=now, holds=holds(f.rule), evidence=dict(f.evidence),
    )  # fmt: skip


def group_of(rule: ruleset.Rule) -> str | None:
    """The rule's node-wide group (``node_wide.group``), None when it has no ``node_wide``."""
    return rule.node_wide.group if rule.node_wide is not None and rule.scope == fields.Scope.GPU else None


def gpu_actions(wanted: Iterable[actions.Action]) -> list[actions.Action]:
    return [a for a in wanted if actions.per_gpu(a.kind)]


def capped(inc: book.Incident, gpu: int) -> bool:
    """A per-GPU action (a power cap) of the incident acts on ``gpu`` and was not undone since."""
    state = False
    for a in inc.actions:
        if a.gpu_index == gpu and actions.per_gpu(a.kind):
            state = not a.on_resolve
    return state


def gpu_restores(
    inc: book.Incident, f: engine.Firing, rule_of: RuleOf, gpu: int
) -> tuple[book.PlannedAction, ...]:
    """(node-wide incident) The per-GPU on_resolve actions of the rules that fired on ``gpu``, for that
    GPU, if one of its actions is still in effect (none after a restore, none for a GPU never capped)."""
    if not capped(inc, gpu):
        return ()
    rules = [
        f.rule if s.rule_id == f.rule.id else rule_of(s.rule_id) for s in inc.signals if s.gpu_index == gpu
    ]
    planned: list[book.PlannedAction] = []
    for rule in rules:
        if rule is not None:
            planned = union(planned, gpu_actions(rule.on_resolve), on_resolve=True, gpu=gpu)
    return tuple(planned)


def same_gpu(inc: book.Incident, f: engine.Firing) -> bool:
    """The incident is about the firing's GPU: by UUID where both are known (an index can change at a
    reboot), else by index."""
    if inc.gpu_uuid is not None and f.gpu_uuid is not None:
        return inc.gpu_uuid == f.gpu_uuid
    return f.gpu is not None and inc.gpu_index == f.gpu


def correlate(
    f: engine.Firing, open_incidents: Iterable[book.Incident], now: float, window_s: float
) -> book.Incident | None:
    """The open incident a firing that has none joins, or None (it opens its own).

    A GPU firing of a ``node_wide`` rule first joins its node's incident of the same group: the
    node-wide one whenever it opened, else one opened less than ``node_wide.within`` ago (about another
    GPU, which the join may make node-wide), then the node's node-wide incident of a group the rule's
    ``node_wide.joins`` names (the cause that explains it: a straggler behind a power brake).
    Otherwise candidates are the node's open incidents opened less than ``window_s`` ago (0 turns this
    correlation off). A port firing (a port-scope rule) joins
    only the newest one about the same port: two faulty ports of a node are two incidents. A GPU firing
    joins the newest one about the same GPU; failing that, the node's only GPU-less incident that is
    neither node-wide nor a port's (a node-scope signal such as ``gpus_missing`` that fired first: the
    incident then takes the GPU). A node-scope firing joins the node's only candidate (a port incident
    too: ``rdma-ports-missing`` beside the one port that is down); with two or more it cannot tell which
    fault it belongs to and opens its own."""
    on_node = [i for i in open_incidents if i.node == f.node and i.state != incidents.IncidentState.RESOLVED]
    if f.port is not None:
        same_port = [i for i in on_node if i.port == f.port and 0 <= now - i.opened_at < window_s]
        return max(same_port, key=lambda i: i.opened_at) if same_port else None
    group = group_of(f.rule)
    if group is not None and f.gpu is not None and f.rule.node_wide is not None:
        within_s = f.rule.node_wide.within_s
        mine = [
            i for i in on_node
            if i.node_wide == group and (i.node_wide_at is not None or 0 <= now - i.opened_at < within_s)
        ]  # fmt: skip
        if mine:
            return max(mine, key=lambda i: (i.node_wide_at is not None, i.opened_at))
        explains = [
            i for i in on_node
            if i.node_wide in f.rule.node_wide.joins and i.node_wide_at is not None
        ]  # fmt: skip
        if explains:  # a node-wide incident of a group that explains this rule: one cause, one incident
            return max(explains, key=lambda i: i.opened_at)
    if window_s <= 0:
        return None
    recent = [i for i in on_node if 0 <= now - i.opened_at < window_s]
    if f.gpu is None:
        return recent[0] if len(recent) == 1 else None
    same = [i for i in recent if same_gpu(i, f)]
    if same:
        return max(same, key=lambda i: i.opened_at)
    gpuless = [i for i in recent if i.gpu_index is None and i.node_wide_at is None and i.port is None]
    return gpuless[0] if len(gpuless) == 1 else None


def stronger(kind: str, current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of one action kind two joined rules both ask for: the stronger where they
    differ, as the catalogue says for the kind (``ActionKind.stronger``: a power cap the lower limit, a
    GPU reset at once rather than when idle); otherwise (a reason or a message) the first, a missing one
    filled from the other."""
    merge = actions.spec(kind).stronger
    return merge(current, wanted) if merge is not None else {**wanted, **current}


@dataclasses.dataclass(frozen=True, slots=True)
class Merge:
    """What a rule's actions add to those already planned: each kind once."""

    params: dict[int, dict[str, Any]]
    """Index in the plan → the stronger parameters of a kind planned and not tried yet (one already
    carried out stays as it was)."""
    add: tuple[book.PlannedAction, ...]
    """The kinds not planned yet, appended in the rule's order."""


def merge(
    planned: Sequence[book.PlannedAction],
    wanted: Iterable[actions.Action],
    *,
    on_resolve: bool = False,
    gpu: int | None = None,
) -> Merge:
    """``gpu``: the GPU a node-wide incident's per-GPU kinds act on (None: the incident's own). A
    per-GPU kind is matched only with the same GPU's, planned after that GPU's last restore."""
    params: dict[int, dict[str, Any]] = {}
    add: list[book.PlannedAction] = []

    def target(kind: str) -> int | None:
        return gpu if actions.per_gpu(kind) else None

    def current(n: int, p: book.PlannedAction, kind: str) -> bool:
        if p.kind != kind or p.on_resolve != on_resolve or p.gpu_index != target(kind):
            return False
        if gpu is None or not actions.per_gpu(kind) or on_resolve:
            return True
        return not any(
            q.on_resolve and q.gpu_index == gpu and actions.per_gpu(q.kind) for q in planned[n + 1 :]
        )

    for a in wanted:
        i = next((n for n, p in enumerate(planned) if current(n, p, a.kind)), None)
        if i is not None:
            if planned[i].status is None:
                params[i] = stronger(a.kind, params.get(i, planned[i].params), a.params)
        elif not any(p.kind == a.kind for p in add):
            add.append(
                book.PlannedAction(
                    kind=a.kind, params=dict(a.params), on_resolve=on_resolve, gpu_index=target(a.kind)
                )
            )
        else:
            n = next(n for n, p in enumerate(add) if p.kind == a.kind)
            add[n] = add[n].model_copy(update={"params": stronger(a.kind, add[n].params, a.params)})
    return Merge({i: p for i, p in params.items() if p != planned[i].params}, tuple(add))


def union(
    planned: Sequence[book.PlannedAction],
    wanted: Iterable[actions.Action],
    *,
    on_resolve: bool = False,
    gpu: int | None = None,
) -> list[book.PlannedAction]:
    """A new plan: ``planned`` (copies) with ``wanted`` merged in (``merge``)."""
    m = merge(planned, wanted, on_resolve=on_resolve, gpu=gpu)
    out = [
        p.model_copy(update={"params": m.params[i]}) if i in m.params else p for i, p in enumerate(planned)
    ]
    return [*out, *m.add]


def evidence_of(inc: book.Incident) -> dict[str, Any]:
    """The incident's evidence: the opening signal's values as they are; once others joined, each
    joined signal's values prefixed with its rule id, and ``signals`` listing every rule, first first.
    An incident about two or more GPUs (node-wide) keeps every GPU's values under ``gpu<index>.``
    (``gpu3.temp_c``; ``gpu3.<rule>.`` for another rule than the opening one), and says which GPUs
    fired (``gpus``), which still do (``gpus_firing``) and, once node-wide, of how many."""
    first, *rest = inc.signals
    gpus = sorted({s.gpu_index for s in inc.signals if s.gpu_index is not None})
    if inc.node_wide is not None and (len(gpus) > 1 or inc.node_wide_at is not None):
        evidence: dict[str, Any] = {
            "node_wide": inc.node_wide,
            "gpus": ",".join(map(str, gpus)),
            "gpus_firing": ",".join(
                map(str, sorted({s.gpu_index for s in inc.signals if s.gpu_index is not None and s.open}))
            ),
        }
        if inc.node_gpus:
            evidence["node_gpus"] = inc.node_gpus
        if len({s.rule_id for s in inc.signals}) > 1:
            evidence["signals"] = ",".join(dict.fromkeys(s.rule_id for s in inc.signals))
        for s in inc.signals:
            where = "node" if s.gpu_index is None else f"gpu{s.gpu_index}"
            rule = "" if s.rule_id == inc.rule_id else f"{s.rule_id}."
            evidence.update({f"{where}.{rule}{k}": v for k, v in s.evidence.items()})
        return evidence
    evidence = dict(first.evidence)
    if rest:
        evidence["signals"] = ",".join(s.rule_id for s in inc.signals)
        for s in rest:
            evidence.update({f"{s.rule_id}.{k}": v for k, v in s.evidence.items()})
    return evidence


def max_severity(a: incidents.Severity, b: incidents.Severity) -> incidents.Severity:
    return max(a, b, key=lambda s: incidents.SEVERITY_LEVELS[s].rank)


@dataclasses.dataclass(frozen=True, slots=True)
class Join:
    """What joining a firing changes on the incident it correlates with (the shell applies it:
    ``incident_shell.apply_join``)."""

    signal: book.Signal
    severity: incidents.Severity
    summary: str
    labels: dict[str, str]
    actions: Merge
    """New kinds appended (pending), pending ones strengthened."""
    gpu: tuple[int, str | None] | None = None
    """A GPU-less incident takes the GPU (index, UUID) of the GPU signal that joined it."""
    node_wide: str | None = None
    """The incident's node-wide group from now on (set when a GPU-less incident takes a grouped GPU)."""
    node_wide_at: float | None = None
    """Set when this join makes it node-wide: the incident leaves its GPU and becomes the node's."""
    node_gpus: int = 0


def join(
    inc: book.Incident, f: engine.Firing, now: float, node_gpus: int = 0, rule_of: RuleOf = no_rule
) -> Join:
    """``f`` (a firing ``correlate`` matched with ``inc``) becomes another signal of ``inc``: the
    incident takes the higher severity, the union of the actions and says which rule joined. In a
    node-wide group's incident, the firing's per-GPU actions are planned for its GPU, and the join that
    brings the GPUs that fired to ``node_wide.threshold(node_gpus)`` (``node_gpus``: the GPUs the node
    reports) makes it the node's incident."""
    group = group_of(f.rule)
    adopt = inc.gpu_index is None and inc.node_wide_at is None and f.gpu is not None
    node_wide = group if adopt and inc.node_wide is None else None
    grouped = (inc.node_wide or node_wide) is not None and f.gpu is not None
    where = f" (GPU {f.gpu})" if adopt or (grouped and f.gpu != inc.gpu_index) else ""
    summary = f"{inc.summary}; joined by {f.rule.id}{where}"
    gpus = {s.gpu_index for s in inc.signals if s.gpu_index is not None} | {f.gpu}
    gpus.discard(None)
    promote = (
        inc.node_wide_at is None
        and group is not None
        and group == inc.node_wide
        and f.rule.node_wide is not None
        and f.rule.node_wide.reached(len(gpus), node_gpus)
    )
    node_wide_at = now if promote else None
    if promote or inc.node_wide_at is not None:
        opener = f.rule if f.rule.id == inc.rule_id else rule_of(inc.rule_id)
        total = max(node_gpus, inc.node_gpus, len(gpus))
        listed = ",".join(str(g) for g in sorted(g for g in gpus if g is not None))
        summary = f"{inc.rule_id} on node {inc.node}: node-wide, {len(gpus)} of {total} GPUs ({listed})"
        if opener is not None and opener.description:
            summary += f": {opener.description}"
    return Join(
        signal=signal_of(f, now),
        severity=max_severity(inc.severity, f.rule.severity),
        summary=summary.strip(),
        labels={**f.rule.labels, **inc.labels},
        actions=merge(inc.actions, f.rule.actions, gpu=f.gpu if grouped else None),
        gpu=(f.gpu, f.gpu_uuid) if adopt and f.gpu is not None else None,
        node_wide=node_wide,
        node_wide_at=node_wide_at,
        node_gpus=max(node_gpus, len(gpus)) if promote or inc.node_wide_at is not None else 0,
    )
