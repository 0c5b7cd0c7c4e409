"""The safety policy between incidents and actuators: what healer is allowed to do right now.

- **Circuit breaker** (global, in KV with compare-and-set so every shard and controller shares it): at
  most ``breaker_max_nodes`` nodes and ``breaker_max_percent`` of the known fleet (never fewer than one
  node) taken out of service by healer in a sliding window. The action that would exceed it is refused,
  the breaker opens, and nothing more is taken out of service until a person runs ``healer breaker
  reset``. A mass fault (or a telemetry glitch that looks like one) can cost at most that much capacity.
- **Domain limits** (``blast``, ``domain_limits``): at most N nodes or P % of any one rack, switch or
  NVLink domain among the breaker's entries; a domain at its limit holds the action (it waits) and opens
  nothing, so the rest of the fleet keeps healing.
- **Exclusions**: nodes under maintenance (``healer exclude add NODE``) get incidents, never actions.
- **Cooldown** (the kinds the catalogue in ``healer.actions`` marks ``per_node_cooldown``): a power
  cap on a GPU for another incident within ``action_cooldown_s`` of the last one waits (no cap/restore
  flapping). The last cap per node lives in KV (``cooldown.<kind>.<node>``), so a
  restarted controller or a standby that takes over honours it. Cordon, drain and migrate have no
  cooldown: they are idempotent (a second cordon is ``already-done``) and must never wait behind another
  incident's.
- **Rate limit**: at most ``actions_per_minute`` actions of one kind per minute; beyond it the action
  waits for the next tick. The window lives in KV (``ratelimit.<kind>``, compare-and-set), so it holds
  across restarts and failovers and is shared by every shard.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import functools
import time
import typing
from typing import Any

import structlog

from healer import actions, config, errors
from healer.actuators import batching
from healer.controller.incidents import gates
from healer.controller.inventory import blast
from healer.controller.remediation import breaker_batch
from healer.controller.store import kv

log = structlog.get_logger(__name__)

BREAKER_KEY = "breaker"
EXCLUDE_PREFIX = "exclude."
FLEET_PREFIX = "fleet.shard."
COOLDOWN_PREFIX = "cooldown."
RATE_PREFIX = "ratelimit."
RATE_WINDOW_S = 60.0
RATE_FRESH_S = 0.1
"""A rate window this process read or wrote less than this long ago answers a view without another KV
read (#43: a burst's actions otherwise read the key once each). All it can miss is another shard's
actions of that last tenth of a second; the check and the append were never one atomic step across
shards anyway (the append is a compare-and-set, the check before it is not)."""


class Breaker:
    def __init__(self, store: kv.Store, settings: config.ControllerSettings) -> None:
        self.store = store
        self.settings = settings
        self._asks: list[tuple[breaker_batch.Ask, asyncio.Future[gates.BreakerAdmission]]] = []
        """Asks waiting for the next batch (``admit``)."""
        self._writing = asyncio.Lock()
        """Held while one batch is decided and written: the asks arriving meanwhile form the next."""
        self._known: breaker_batch.Known | None = None
        """The document as this breaker last wrote it (parsed once), tried first; None: read it."""

    def limit(self, fleet_size: int) -> int:
        return gates.limit_of(fleet_size, self.settings)

    async def status(self) -> dict[str, Any]:
        doc = await self.store.get(BREAKER_KEY)
        return doc.value if doc else {"open": False, "entries": []}

    async def admit(
        self, node: str, fleet_size: int, incident_id: str, domains: blast.View | None = None
    ) -> gates.BreakerAdmission:
        """May healer take ``node`` out of service? Decided by ``gates.breaker_admission`` (for a batch:
        ``breaker_batch.admit_all``, the same verdicts), written with compare-and-set (every shard and
        controller shares the breaker). ``domains``: the node's limited failure domains (``blast``),
        counted against the same document's entries. The asks that arrive while one batch is written
        are the next batch: one compare-and-set for a burst's nodes, not one each (#43)."""
        ask = breaker_batch.Ask(node, fleet_size, incident_id, domains)
        answer: asyncio.Future[gates.BreakerAdmission] = asyncio.get_running_loop().create_future()
        self._asks.append((ask, answer))
        async with self._writing:
            if not answer.done():
                await asyncio.sleep(0)  # the asks made in the same turn of the loop join this batch
                batch, self._asks = self._asks, []
                try:
                    await self._admit_batch(batch)
                finally:  # cancelled or failed before its answers: the rest wait for the next batch
                    self._asks[:0] = [(a, f) for a, f in batch if not f.done() and f is not answer]
        return answer.result()

    async def _admit_batch(
        self, batch: list[tuple[breaker_batch.Ask, asyncio.Future[gates.BreakerAdmission]]]
    ) -> None:
        """One compare-and-set for ``batch``: against the document this breaker last wrote when it is
        still current (a conflict means someone else wrote since: read it and decide again)."""
        for _ in range(20):
            known = self._known
            if known is None:
                doc = await self.store.get(BREAKER_KEY)
                known = breaker_batch.Known.of(doc.value, doc.revision) if doc else None
            state = known.value if known else {"open": False, "entries": []}
            asks = [a for a, _ in batch]
            parsed = known.entries if known else ()
            admissions, written, entries = breaker_batch.admit_all(
                state, asks, time.time(), self.settings, parsed
            )
            if written is not None:
                try:
                    if known is None:
                        revision = await self.store.create(BREAKER_KEY, written)
                    else:
                        revision = await self.store.update(BREAKER_KEY, written, known.revision)
                except kv.Conflict:
                    self._known = None
                    continue
                self._known = breaker_batch.Known(written, revision, entries)
            for (ask, answer), admission in zip(batch, admissions, strict=True):
                if admission.tripped:
                    log.error("breaker.tripped", node=ask.node, reason=admission.reason)
                if not answer.done():
                    answer.set_result(admission)
            return
        raise errors.TemporaryError("breaker: too much contention on the KV key")

    async def reset(self, by: str) -> dict[str, Any]:
        state = {"open": False, "entries": [], "reset_by": by, "reset_at": time.time()}
        self._known = None
        await self.store.put(BREAKER_KEY, state)
        log.warning("breaker.reset", by=by)
        return state


class Exclusions:
    def __init__(self, store: kv.Store) -> None:
        self.store = store
        self.nodes: dict[str, dict[str, Any]] = {}

    async def refresh(self) -> None:
        found: dict[str, dict[str, Any]] = {}
        for key in await self.store.keys(EXCLUDE_PREFIX):
            doc = await self.store.get(key)
            if doc is not None:
                found[key.removeprefix(EXCLUDE_PREFIX)] = doc.value
        self.nodes = found

    async def add(self, node: str, by: str, reason: str) -> None:
        await self.store.put(EXCLUDE_PREFIX + node, {"by": by, "reason": reason, "at": time.time()})

    async def remove(self, node: str) -> None:
        await self.store.delete(EXCLUDE_PREFIX + node)


class Limits:
    """Cooldowns and rate limits, both durable in KV (so a restart or a failover keeps them); without a
    store (unit use) they live in this process's memory."""

    def __init__(self, settings: config.ControllerSettings, store: kv.Store | None = None) -> None:
        self.settings = settings
        self.store = store
        self.last: dict[tuple[str, str], gates.LastAction] = {}
        self.recent: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)
        self._appends: dict[str, batching.Coalesced[tuple[float, int], None]] = {}
        self._reads: dict[str, batching.Coalesced[None, None]] = {}
        """Each kind's rate window read: the reads asked while one is in flight share the next (#43)."""
        self._written: dict[str, kv.Doc] = {}
        """Each kind's rate window as this process last wrote it, tried first by the next append."""
        self._seen: dict[str, _Seen] = {}
        """Each kind's newest rate window read or written, when, and its times parsed (``RATE_FRESH_S``)."""

    async def _last(self, kind: str, node: str) -> gates.LastAction | None:
        """The newest action of ``kind`` on ``node``: this process's, or KV's when newer (another
        controller's, or this one's before a restart)."""
        mine = self.last.get((kind, node))
        if self.store is None:
            return mine
        doc = await self.store.get(f"{COOLDOWN_PREFIX}{kind}.{node}")
        if doc is None:
            return mine
        stored = gates.LastAction(float(doc.value.get("at", 0.0)), str(doc.value.get("incident_id", "")))
        return stored if mine is None or stored.at > mine.at else mine

    async def _window(self, kind: str, now: float) -> tuple[list[float], kv.Doc | None]:
        """Times of ``kind`` actions in the last minute (from KV when there is a store)."""
        if self.store is None:
            window = self.recent[kind]
            while window and now - window[0] > RATE_WINDOW_S:
                window.popleft()
            return list(window), None
        seen = self._seen.get(kind)
        if seen is None or time.monotonic() - seen.at >= RATE_FRESH_S:
            if kind not in self._reads:
                self._reads[kind] = batching.Coalesced(functools.partial(self._read_windows, kind))
            await self._reads[kind](None)
            seen = self._seen[kind]
        return seen.within(now), seen.doc

    async def _read_windows(self, kind: str, items: list[None]) -> list[None]:
        assert self.store is not None
        at = time.monotonic()
        self._saw(kind, at, await self.store.get(f"{RATE_PREFIX}{kind}"))
        return [None] * len(items)

    def _saw(self, kind: str, at: float, doc: kv.Doc | None) -> None:
        """``doc`` was ``kind``'s window at ``at`` (monotonic): kept unless a newer revision is."""
        seen = self._seen.get(kind)
        revision = doc.revision if doc is not None else 0
        if seen is None or seen.revision <= revision or seen.at + RATE_FRESH_S <= at:
            self._seen[kind] = _Seen.of(at, doc)

    async def view(self, kind: str, node: str, now: float, *, window: bool = True) -> gates.LimitsView:
        """What ``gates.limits_gate`` needs to know about ``kind`` on ``node`` now (``window=False``: only
        the cooldown, for an action whose place in the rate window is reserved)."""
        last = await self._last(kind, node) if _has_cooldown(kind) else None
        times, _ = await self._window(kind, now) if window else ([], None)
        return gates.LimitsView(last, tuple(times))

    async def check(self, kind: str, node: str, incident_id: str, now: float) -> gates.Verdict:
        """ALLOW, or WAIT with why not."""
        view = await self.view(kind, node, now)
        return gates.limits_verdict(kind, node, incident_id, now, view, self.settings)

    async def record(self, kind: str, node: str, incident_id: str, now: float) -> None:
        """Written before the action runs: a crash after it still leaves the cooldown and the rate
        window in force. The window is updated with compare-and-set (several shards share it)."""
        await self._cooldown(kind, node, incident_id, now)
        await self._append(kind, now, 1)

    async def reserve(self, kind: str, nodes: list[str], incident_id: str, now: float) -> gates.Verdict:
        """One step of ``kind`` across ``nodes`` (a domain's per-GPU power caps): ALLOW once the step is in
        the rate window, one entry per node, written at once; WAIT when the window has no room for it
        (a step wider than ``actions_per_minute`` nodes waits for an empty window, then goes whole).
        Each node's cooldown is checked by its actions and recorded here, before any of them runs."""
        times, _ = await self._window(kind, now)
        room = self.settings.actions_per_minute - len(times)
        if times and room < len(nodes):
            return gates.Verdict.wait(
                f"rate limit: {len(times)} {kind} actions in the last minute, a step on {len(nodes)} nodes"
            )
        for node in nodes:
            await self._cooldown(kind, node, incident_id, now)
        await self._append(kind, now, len(nodes))
        return gates.ALLOW

    async def _cooldown(self, kind: str, node: str, incident_id: str, now: float) -> None:
        if _has_cooldown(kind) and self.store is not None:
            await self.store.put(f"{COOLDOWN_PREFIX}{kind}.{node}", {"at": now, "incident_id": incident_id})
        self.last[(kind, node)] = gates.LastAction(now, incident_id)

    async def _append(self, kind: str, now: float, count: int) -> None:
        """``count`` entries at ``now`` in ``kind``'s rate window (compare-and-set in KV). The appends
        that arrive while one is written go in the next write together: a burst's actions would
        otherwise race for the one key and give up (``too much contention``) (#43)."""
        self.recent[kind].extend([now] * count)
        if self.store is None:
            return
        if kind not in self._appends:
            self._appends[kind] = batching.Coalesced(functools.partial(self._append_all, kind))
        await self._appends[kind]((now, count))

    async def _append_all(self, kind: str, items: list[tuple[float, int]]) -> list[None]:
        """One compare-and-set for ``items``: against the window as this process last wrote it while it
        is current (a conflict means another shard wrote since: read it and try again)."""
        assert self.store is not None
        now = max(at for at, _ in items)
        for _ in range(20):
            at = time.monotonic()
            doc = self._written.pop(kind, None) or await self.store.get(f"{RATE_PREFIX}{kind}")
            known = self._seen.get(kind)
            times = (
                known.within(now)
                if known is not None and doc is not None and known.revision == doc.revision
                else _times(doc, now)[0]
            )
            value = {"at": [*times, *(at for at, count in items for _ in range(count))]}
            key = f"{RATE_PREFIX}{kind}"
            try:
                if doc is None:
                    revision = await self.store.create(key, value)
                else:
                    revision = await self.store.update(key, value, doc.revision)
            except kv.Conflict:
                continue
            self._written[kind] = kv.Doc(key, value, revision)
            self._saw(kind, at, self._written[kind])
            return [None] * len(items)
        raise errors.TemporaryError(f"rate limit: too much contention on {RATE_PREFIX}{kind}")


def _has_cooldown(kind: str) -> bool:
    spec = actions.kind(kind)
    return spec is not None and spec.per_node_cooldown


class _Seen(typing.NamedTuple):
    """A rate window as read or written at ``at`` (monotonic), its times parsed and sorted once."""

    at: float
    doc: kv.Doc | None
    times: list[float]

    @property
    def revision(self) -> int:
        return self.doc.revision if self.doc is not None else 0

    @classmethod
    def of(cls, at: float, doc: kv.Doc | None) -> _Seen:
        return cls(at, doc, sorted(float(t) for t in (doc.value.get("at", []) if doc else [])))

    def within(self, now: float) -> list[float]:
        """The times within the last minute of ``now`` (as ``_times``)."""
        start = bisect.bisect_left(self.times, True, key=lambda t: now - t <= RATE_WINDOW_S)
        return self.times[start:]


def _times(doc: kv.Doc | None, now: float) -> tuple[list[float], kv.Doc | None]:
    """The times in a stored rate window that are within the last minute of ``now``."""
    times = [float(t) for t in (doc.value.get("at", []) if doc else []) if now - float(t) <= RATE_WINDOW_S]
    return times, doc
