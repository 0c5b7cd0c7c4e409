"""Leader (and shard) leases in the KV bucket ``healer-leases``, whose TTL makes a dead leader's lease
lapse by itself. NATS does the consensus; this is only the protocol on top:

- acquire: ``create`` the key (succeeds only if nobody holds it); the revision it returns is this
  leader's **fencing token**, higher than any earlier leader's because stream sequences only grow;
- renew: ``update`` with the last revision, every ``ttl/3``. A conflict means someone else holds it now
  (unless the key still names this holder and token: a renew whose reply was lost, adopted): the lease
  is dropped at once. A temporary failure (a server away, a bucket electing a leader) keeps the token
  and retries sooner; the lease is dropped once the last renew is a whole TTL old (the key has lapsed);
- ``valid`` is false once a renew is overdue by more than ``ttl/2`` even if no error was seen, so a
  partitioned leader stops acting before a standby can take over (``Controller.leader`` and the
  ``healer_controller_leader`` gauge follow it);
- ``release(hold_off_s)`` deletes the key and stays away that long, so a standby can take the lease;
- a standby tries to take a held lease every ``ttl/5``, and just after the holder's key is due to lapse
  (the ``at`` of its last write plus the TTL) when that comes sooner: a dead leader's standby takes over
  about one TTL after the leader's last renewal, not up to a fifth of a TTL later;
- re-take: a holder that lost its lease to an outage (its renewals failed for a TTL) and finds the key
  still naming it when the server is back takes it again at once with ``update`` on the key's revision
  (a new, higher fencing token) instead of waiting for its own stale key to lapse. The key names a holder
  only while nobody else wrote it, so this never takes a lease another controller won meanwhile;
- what a standby cannot see is said: ``unheld_s`` is how long no holder was seen (this one's or another's),
  ``api_failing_s`` how long JetStream has failed every lease request, and a standby that cannot take a
  free lease logs why (``lease.acquire_failed``, at most one line per ``ACQUIRE_LOG_S``, all counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from healer import errors
from healer.controller.observability import throttle
from healer.controller.store import kv

log = structlog.get_logger(__name__)


def key_of(shard: int) -> str:
    """The lease key of a controller shard in ``healer-leases``."""
    return f"leader.shard-{shard}"


ACQUIRE_LOG_S = 30.0
"""At most one ``lease.acquire_failed`` line per this many seconds (each carries the counts since)."""
LAPSE_MARGIN_S = 0.05
"""A standby tries this long after the holder's key is due to lapse (its last write's ``at`` + the TTL)."""


class Lease:
    def __init__(
        self,
        store: kv.Store,
        key: str,
        holder: str,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.key = key
        self.holder = holder
        self.ttl_s = ttl_s
        self.clock = clock
        self.token: int | None = None
        self._revision = 0
        self._renewed_at = 0.0
        self._hold_off_until = -float("inf")
        self.log = log.bind(lease=key, holder=holder)
        self._holder_seen_at = clock()
        """When a holder of this key (this one, or another) was last seen: the start counts as seen."""
        self._api_failing_since: float | None = None
        self.last_error: str | None = None
        """Why the last lease request to JetStream failed (one line); None after a success."""
        self._acquire_failures = throttle.Throttled(self.log, "lease.acquire_failed", ACQUIRE_LOG_S, clock)
        self._lapses_at: float | None = None
        """When another holder's key is due to lapse (this clock), from the ``at`` it last wrote."""

    @property
    def held(self) -> bool:
        return self.token is not None

    def valid(self) -> bool:
        return self.token is not None and self.clock() - self._renewed_at < self.ttl_s / 2

    def unheld_s(self) -> float:
        """Seconds since a holder of this lease was last seen (0 while this process holds it)."""
        return 0.0 if self.token is not None else max(0.0, self.clock() - self._holder_seen_at)

    def api_failing_s(self) -> float:
        """Seconds every lease request to JetStream has failed for (0 after a success)."""
        since = self._api_failing_since
        return 0.0 if since is None else max(0.0, self.clock() - since)

    def _api_ok(self) -> None:
        self._api_failing_since = None
        self.last_error = None

    def _api_failed(self, e: BaseException) -> str:
        why = str(e) or repr(e)
        if self._api_failing_since is None:
            self._api_failing_since = self.clock()
        self.last_error = why
        return why

    async def try_acquire(self) -> bool:
        if self.clock() < self._hold_off_until:
            return False
        try:
            rev = await asyncio.wait_for(
                self.store.create(self.key, {"holder": self.holder, "at": time.time()}), self.ttl_s / 3
            )
        except kv.Conflict:
            self._api_ok()
            return await self._retake()
        except (errors.HealerError, TimeoutError) as e:
            why = self._api_failed(e)
            self._acquire_failures.note(why, error=why, unheld_s=round(self.unheld_s(), 1))
            return False
        self._api_ok()
        self.token = self._revision = rev
        self._renewed_at = self._holder_seen_at = self.clock()
        self.log.info("lease.acquired", token=rev)
        return True

    async def _retake(self) -> bool:
        """The key exists: if it still names this holder (its renewals failed through an outage and the
        key has not lapsed yet), take it again now, with a new token; otherwise someone else holds it."""
        try:
            doc = await asyncio.wait_for(self.store.get(self.key), self.ttl_s / 3)
        except (errors.HealerError, TimeoutError) as e:
            self._api_failed(e)
            return False
        if doc is None:
            return False  # lapsed between the two requests: the next attempt creates it
        if doc.value.get("holder") != self.holder:
            self._holder_seen_at = self.clock()
            at = doc.value.get("at")
            if isinstance(at, int | float) and not isinstance(at, bool):
                self._lapses_at = self.clock() + float(at) + self.ttl_s - time.time()
            return False
        try:
            rev = await asyncio.wait_for(
                self.store.update(self.key, {"holder": self.holder, "at": time.time()}, doc.revision),
                self.ttl_s / 3,
            )
        except kv.Conflict:
            return False  # written meanwhile (lapsed and created by another): not ours
        except (errors.HealerError, TimeoutError) as e:
            self._api_failed(e)
            return False
        self.token = self._revision = rev
        self._renewed_at = self._holder_seen_at = self.clock()
        self.log.info("lease.retaken", token=rev, previous=doc.value.get("token"))
        return True

    async def renew(self) -> bool:
        if self.token is None:
            return False
        try:
            self._revision = await asyncio.wait_for(
                self.store.update(
                    self.key, {"holder": self.holder, "at": time.time(), "token": self.token}, self._revision
                ),
                self.ttl_s / 3,  # a reply that takes longer is as good as lost: try again
            )
        except kv.Conflict as e:
            self._api_ok()
            if not await self._adopt():
                self.log.warning("lease.lost", token=self.token, error=str(e))
                self.token = None
                self._holder_seen_at = self.clock()  # another holder wrote it
                return False
        except (errors.HealerError, TimeoutError) as e:
            self._api_failed(e)
            overdue = self.clock() - self._renewed_at
            if overdue >= self.ttl_s:
                self.log.warning("lease.lost", token=self.token, error=repr(e), overdue_s=round(overdue, 1))
                self.token = None
                self._holder_seen_at = self._renewed_at  # held until then
            else:
                self.log.warning(
                    "lease.renew_failed", token=self.token, error=repr(e), overdue_s=round(overdue, 1)
                )
            return False
        self._api_ok()
        self._renewed_at = self._holder_seen_at = self.clock()
        return True

    async def _adopt(self) -> bool:
        """After a conflict: is the key still ours (a renew that landed but whose reply was lost)?"""
        try:
            doc = await self.store.get(self.key)
        except errors.HealerError:
            return False
        if doc is None or doc.value.get("holder") != self.holder or doc.value.get("token") != self.token:
            return False
        self._revision = doc.revision
        self._renewed_at = self.clock()
        return True

    async def release(self, hold_off_s: float = 0.0) -> None:
        """Give the lease up; do not take it again for ``hold_off_s`` (so a standby can)."""
        self._hold_off_until = self.clock() + hold_off_s
        if self.token is None:
            return
        self.token = None
        try:
            await self.store.delete(self.key)
            self.log.info("lease.released")
        except errors.HealerError as e:
            self.log.warning("lease.release_failed", error=str(e))

    def next_attempt_in(self) -> float:
        """Seconds until a controller without the lease tries to take it again: a fifth of a TTL, or just
        after the holder's key is due to lapse when that comes sooner (a dead holder's key lapses one TTL
        after its last renewal: the standby then takes over within about a TTL of the death, not up to a
        fifth of a TTL later). Only a wait is shortened: the key is taken only if it is gone."""
        pause = self.ttl_s / 5
        if self._lapses_at is not None:
            until = self._lapses_at + LAPSE_MARGIN_S - self.clock()
            if until > 0:
                pause = min(pause, until)
            elif until > -pause:  # due, and the server has not dropped it yet: look again soon
                pause = self.ttl_s / 20
        return pause

    async def keep(self, stop: asyncio.Event, on_change: Callable[[bool], None] | None = None) -> None:
        """Acquire when free, renew while held, until ``stop``; calls ``on_change(leader)`` on flips."""
        was = False
        while not stop.is_set():
            ok = await self.try_acquire() if self.token is None else await self.renew()
            now = self.held
            if now != was and on_change is not None:
                on_change(now)
            was = now
            # A failed renew is tried again soon: the key lapses one TTL after the last good one.
            pause = (self.ttl_s / 3 if ok else self.ttl_s / 10) if now else self.next_attempt_in()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=pause)
        await self.release()
        if was and on_change is not None:
            on_change(False)
