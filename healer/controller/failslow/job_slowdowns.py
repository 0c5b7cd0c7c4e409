"""Job-level slowdowns (#28, docs/fail-slow.md): a job that runs slower with nobody to blame is one
``job-slowdown`` incident about the job, not a straggler.

Some slowdowns have no culprit GPU, link or port: the job's ranks all wait on something outside their
GPUs (a data loader, storage, the network beyond the node, the job itself). Every rank then waits alike,
so telemetry shows no GPU or node lagging its peers, and nobody is named (the scorer and the port test
name nobody). Telemetry alone cannot tell such a stall from a job that changed what it does (a smaller
batch, an evaluation phase), so healer reports it only with evidence from the job itself: its step times
(``healer.steps``). A job whose step times say it runs ``STEP_SLOWER`` (5 %) or more slower than its
baseline, while no GPU or node of it is a straggler or about to be one (``FailSlow.job_level``), gets one
incident: rule ``job-slowdown``, severity info, node ``job.<id>`` (a domain incident, ``data.domain``
``job=<id>`` with the job's nodes as members), summary and evidence from the step times, and no action:
nothing on any node would fix it, and no node is drained. It resolves when the job runs at its baseline
again or stops reporting, or when a straggler is named in it after all (that incident takes over).

Pure: ``plan`` says what to open, update and resolve; the incident shell carries it out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Sequence
from typing import Final

from healer.controller.failslow import detector
from healer.controller.incidents import book, shared_cause
from healer.schemas import incidents

RULE_ID: Final = "job-slowdown"
DOMAIN_KEY: Final = "job"
UPDATE_POINTS: Final = 5.0
"""An open incident is updated when its job's slowdown moved by this many percentage points."""
NAMED: Final = "a straggler was named in the job: its incident takes over"
RECOVERED: Final = "the job runs at its baseline step time again, or stopped reporting"


@dataclasses.dataclass(frozen=True)
class Plan:
    open: tuple[detector.JobSlowdown, ...] = ()
    update: tuple[tuple[book.Incident, detector.JobSlowdown], ...] = ()
    resolve: tuple[tuple[book.Incident, str], ...] = ()


def node_of(job: str) -> str:
    """The incident's ``node``: ``job.<id>`` in the characters a node name may have."""
    return shared_cause.domain_node(DOMAIN_KEY, job)


def job_of(inc: book.Incident) -> str | None:
    return inc.domain.value if inc.domain is not None else None


def plan(
    open_incidents: Iterable[book.Incident],
    candidates: Sequence[detector.JobSlowdown],
    slower: Collection[str],
    named: Collection[str],
) -> Plan:
    """``candidates``: jobs slower with nobody named or pending (``FailSlow.job_level``); ``slower``:
    every job slower by its step times now; ``named``: jobs with a straggler named."""
    by_job = {c.job: c for c in candidates}
    opened: dict[str, book.Incident] = {}
    update, resolve = [], []
    for inc in open_incidents:
        job = job_of(inc)
        if inc.rule_id != RULE_ID or inc.state != incidents.IncidentState.OPEN or job is None:
            continue
        opened[job] = inc
        if job in named:
            resolve.append((inc, NAMED))
        elif job not in slower:
            resolve.append((inc, RECOVERED))
        elif job in by_job:
            pct = inc.evidence.get("slower_pct")
            now_pct = by_job[job].slower_pct
            if not isinstance(pct, int | float) or abs(now_pct - pct) >= UPDATE_POINTS:
                update.append((inc, by_job[job]))
    new = tuple(c for c in candidates if c.job not in opened)
    return Plan(new, tuple(update), tuple(resolve))


def evidence(slow: detector.JobSlowdown) -> dict[str, float | int | str | bool | None]:
    return {
        "job": slow.job,
        "slower_pct": slow.slower_pct,
        "slower_since": slow.since,
        "steps": slow.summary,
        "nodes": ",".join(slow.nodes)[:1000],
    }


def summary(slow: detector.JobSlowdown) -> str:
    return (
        f"{slow.summary}; no GPU, link or port of the job lags its peers, so nobody is named: the job"
        " waits on something outside its GPUs (data loading, storage, the network, the job itself)"
    )


def new_incident(
    slow: detector.JobSlowdown, incident_id: str, now: float, mode: incidents.Mode
) -> book.Incident:
    cap = incidents.DOMAIN_MEMBERS_MAX
    return book.Incident(
        id=incident_id, rule_id=RULE_ID, severity="info", node=node_of(slow.job), summary=summary(slow),
        evidence=evidence(slow), labels={"category": "fail-slow"}, mode=mode, opened_at=now, updated_at=now,
        domain=incidents.Domain(
            key=DOMAIN_KEY, value=slow.job[:253], suspected="outside the job's GPUs", signal_rule=RULE_ID,
            members=list(slow.nodes)[:cap], member_count=len(slow.nodes), size=len(slow.nodes),
        ),
    )  # fmt: skip
