"""The safety policy between incidents and actuators: what healer is allowed to do right now.

- **Circuit breaker** (global, in KV with compare-and-set so every shard and controller shares it): at
  most ``breaker_max_nodes`` nodes and ``breaker_max_percent`` of the known fleet (never fewer than one
  node) taken out of service by healer in a sliding window. The action that would exceed it is refused,
  the breaker opens, and nothing more is taken out of service until a person runs ``healer breaker
  reset``. A mass fault (or a telemetry glitch that looks like one) can cost at most that much capacity.
- **Exclusions**: nodes under maintenance (``healer exclude add NODE``) get incidents, never actions.
- **Cooldown**: a power cap on a GPU for another incident within ``action_cooldown_s`` of the last one
  waits (no cap/restore flapping). The last cap per node lives in KV (``cooldown.<kind>.<node>``), so a
  restarted controller or a standby that takes over honours it. Cordon, drain and migrate have no
  cooldown: they are idempotent (a second cordon is ``already-done``) and must never wait behind another
  incident's.
- **Rate limit**: at most ``actions_per_minute`` actions of one kind per minute; beyond it the action
  waits for the next tick. The window lives in KV (``ratelimit.<kind>``, compare-and-set), so it holds
  across restarts and failovers and is shared by every shard.
"""

from __future__ import annotations

import collections
import math
import time
from typing import Any

import structlog

from healer import config, errors
from healer.controller import kv

log = structlog.get_logger(__name__)

BREAKER_KEY = "breaker"
EXCLUDE_PREFIX = "exclude."
FLEET_PREFIX = "fleet.shard."
TAKES_OUT_OF_SERVICE = frozenset({"cordon", "drain", "migrate", "inspect"})
COOLDOWN_KINDS = frozenset({"power_limit"})
COOLDOWN_PREFIX = "cooldown."
RATE_PREFIX = "ratelimit."
RATE_WINDOW_S = 60.0


class Breaker:
    def __init__(self, store: kv.Store, settings: config.ControllerSettings) -> None:
        self.store = store
        self.settings = settings

    def limit(self, fleet_size: int) -> int:
        by_percent = math.floor(fleet_size * self.settings.breaker_max_percent / 100.0)
        return max(1, min(self.settings.breaker_max_nodes, by_percent))

    async def status(self) -> dict[str, Any]:
        doc = await self.store.get(BREAKER_KEY)
        return doc.value if doc else {"open": False, "entries": []}

    async def admit(self, node: str, fleet_size: int, incident_id: str) -> tuple[bool, str, bool]:
        """May healer take ``node`` out of service? -> (allowed, reason, tripped_now)."""
        for _ in range(20):
            doc = await self.store.get(BREAKER_KEY)
            state: dict[str, Any] = doc.value if doc else {"open": False, "entries": []}
            now = time.time()
            entries = [
                e for e in state.get("entries", []) if now - float(e[1]) < self.settings.breaker_window_s
            ]
            if any(e[0] == node for e in entries):
                return True, "node already counted in the breaker window", False
            if state.get("open"):
                return (
                    False,
                    f"circuit breaker open since {state.get('opened_at')}: {state.get('reason')}",
                    False,
                )
            limit = self.limit(fleet_size)
            tripped = len(entries) + 1 > limit
            if tripped:
                state = {
                    "open": True,
                    "opened_at": now,
                    "reason": f"{len(entries) + 1} nodes in {self.settings.breaker_window_s:g}s would exceed "
                    f"the limit of {limit} (fleet of {fleet_size})",
                    "entries": entries,
                    "refused": [node, incident_id],
                }
            else:
                state = {"open": False, "entries": [*entries, [node, now, incident_id]]}
            try:
                if doc is None:
                    await self.store.create(BREAKER_KEY, state)
                else:
                    await self.store.update(BREAKER_KEY, state, doc.revision)
            except kv.Conflict:
                continue
            if tripped:
                log.error("breaker.tripped", node=node, reason=state["reason"])
                return False, str(state["reason"]), True
            return True, f"{len(entries) + 1} of {limit} in the window", False
        raise errors.TemporaryError("breaker: too much contention on the KV key")

    async def reset(self, by: str) -> dict[str, Any]:
        state = {"open": False, "entries": [], "reset_by": by, "reset_at": time.time()}
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
        self.last: dict[tuple[str, str], tuple[float, str]] = {}
        self.recent: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)

    async def _last(self, kind: str, node: str) -> tuple[float, str] | None:
        """The newest (time, incident) of ``kind`` on ``node``: this process's, or KV's when newer
        (another controller's, or this one's before a restart)."""
        mine = self.last.get((kind, node))
        if self.store is None:
            return mine
        doc = await self.store.get(f"{COOLDOWN_PREFIX}{kind}.{node}")
        if doc is None:
            return mine
        stored = (float(doc.value.get("at", 0.0)), str(doc.value.get("incident_id", "")))
        return stored if mine is None or stored[0] > mine[0] else mine

    async def _window(self, kind: str, now: float) -> tuple[list[float], kv.Doc | None]:
        """Times of ``kind`` actions in the last minute (from KV when there is a store)."""
        if self.store is None:
            window = self.recent[kind]
            while window and now - window[0] > RATE_WINDOW_S:
                window.popleft()
            return list(window), None
        doc = await self.store.get(f"{RATE_PREFIX}{kind}")
        times = [
            float(t) for t in (doc.value.get("at", []) if doc else []) if now - float(t) <= RATE_WINDOW_S
        ]
        return times, doc

    async def check(self, kind: str, node: str, incident_id: str, now: float) -> str:
        """Empty string when allowed; else why not (and the action waits)."""
        prev = await self._last(kind, node) if kind in COOLDOWN_KINDS else None
        if prev and prev[1] != incident_id and now - prev[0] < self.settings.action_cooldown_s:
            return f"cooldown: {kind} on {node} {now - prev[0]:.0f}s ago for {prev[1]}"
        times, _ = await self._window(kind, now)
        if len(times) >= self.settings.actions_per_minute:
            return f"rate limit: {len(times)} {kind} actions in the last minute"
        return ""

    async def record(self, kind: str, node: str, incident_id: str, now: float) -> None:
        """Written before the action runs: a crash after it still leaves the cooldown and the rate
        window in force. The window is updated with compare-and-set (several shards share it)."""
        if kind in COOLDOWN_KINDS and self.store is not None:
            await self.store.put(f"{COOLDOWN_PREFIX}{kind}.{node}", {"at": now, "incident_id": incident_id})
        self.last[(kind, node)] = (now, incident_id)
        self.recent[kind].append(now)
        if self.store is None:
            return
        for _ in range(20):
            times, doc = await self._window(kind, now)
            value = {"at": [*times, now]}
            try:
                if doc is None:
                    await self.store.create(f"{RATE_PREFIX}{kind}", value)
                else:
                    await self.store.update(f"{RATE_PREFIX}{kind}", value, doc.revision)
            except kv.Conflict:
                continue
            return
        raise errors.TemporaryError(f"rate limit: too much contention on {RATE_PREFIX}{kind}")
