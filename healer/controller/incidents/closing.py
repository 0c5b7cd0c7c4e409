"""A person closes an incident that only a person can end: ``healer incidents close ID``.

Some incidents have no rule that resolves them: a ``hardware-replacement`` incident (the node stays out
of service until a person has dealt with the hardware), an incident whose rule was removed from the rule
files. The command writes a request into KV ``healer-state`` (``close.<incident id>``: who, why, when);
the leader's housekeeping resolves the incident, with ``closed_by`` and ``close_reason`` in its evidence,
publishes ``resolved`` (so Alertmanager resolves its alert) and deletes the request. Nothing is undone:
a node healer cordoned stays cordoned until the person returns it. A fault that still shows fires anew.
A request for an incident that is no longer open is dropped (logged).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import structlog

from healer import errors
from healer.controller.incidents import book
from healer.controller.store import kv
from healer.schemas import incidents

PREFIX = "close."
"""KV ``healer-state``: a person's request to close an incident."""


async def request(store: kv.Store, incident_id: str, by: str, reason: str) -> dict[str, object]:
    """Ask the leader to close ``incident_id``; PermanentError when no such incident is open."""
    if await store.get(book.PREFIX + incident_id) is None:
        raise errors.PermanentError(f"no open incident {incident_id} (healer incidents tail lists them)")
    doc: dict[str, object] = {"by": by, "reason": reason, "at": time.time()}
    await store.put(PREFIX + incident_id, doc)
    return doc


class Closer:
    def __init__(
        self,
        store: kv.Store,
        incidents_book: book.Book,
        *,
        publish: Callable[[book.Incident, incidents.Change], Awaitable[None]],
        release: Callable[[str, str, int | None, str | None], None],
        clock: Callable[[], float],
        log: structlog.typing.FilteringBoundLogger,
    ) -> None:
        self.store = store
        self.book = incidents_book
        self.publish = publish
        self.release = release
        self.clock = clock
        self.log = log

    async def apply(self) -> int:
        """Close every incident a person asked to close; returns how many were closed."""
        closed = 0
        for key in await self.store.keys(PREFIX):
            doc = await self.store.get(key)
            incident_id = key.removeprefix(PREFIX)
            inc = next((i for i in self.book.all() if i.id == incident_id), None)
            if inc is None or inc.state == incidents.IncidentState.RESOLVED:
                self.log.info("incident.close_dropped", incident_id=incident_id, detail="not open")
                await self.store.delete(key)
                continue
            who = doc.value if doc else {}
            inc.state = incidents.IncidentState.RESOLVED
            inc.resolved_at = self.clock()
            inc.evidence = {
                **inc.evidence,
                "closed_by": str(who.get("by", "")),
                "close_reason": str(who.get("reason", ""))[:500],
            }
            for signal in inc.signals:
                self.release(signal.rule_id, inc.node, signal.gpu_index, signal.port)
            for action in inc.actions:  # nothing more runs: the person decides what happens next
                if action.status is None:
                    action.status, action.detail, action.at = (
                        incidents.ActionStatus.SKIPPED,
                        "incident closed by a person",
                        inc.resolved_at,
                    )
            await self.publish(inc, incidents.Change.RESOLVED)
            await self.store.delete(key)
            closed += 1
        return closed
