"""Leader (and shard) leases in the KV bucket ``healer-leases``, whose TTL makes a dead leader's lease
lapse by itself. NATS does the consensus; this is only the protocol on top:

- acquire: ``create`` the key (succeeds only if nobody holds it); the revision it returns is this
  leader's **fencing token**, higher than any earlier leader's because stream sequences only grow;
- renew: ``update`` with the last revision, every ``ttl/3``; a failed renew means someone else holds it
  now (or the bucket is unreachable): leadership is dropped at once;
- ``valid`` is false once a renew is overdue by more than ``ttl/2`` even if no error was seen, so a
  partitioned leader stops acting before a standby can take over.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog

from healer import errors
from healer.controller import kv

log = structlog.get_logger(__name__)


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
        self.log = log.bind(lease=key, holder=holder)

    @property
    def held(self) -> bool:
        return self.token is not None

    def valid(self) -> bool:
        return self.token is not None and self.clock() - self._renewed_at < self.ttl_s / 2

    async def try_acquire(self) -> bool:
        try:
            rev = await self.store.create(self.key, {"holder": self.holder, "at": time.time()})
        except kv.Conflict:
            return False
        except errors.TemporaryError as e:
            self.log.warning("lease.acquire_failed", error=str(e))
            return False
        self.token = self._revision = rev
        self._renewed_at = self.clock()
        self.log.info("lease.acquired", token=rev)
        return True

    async def renew(self) -> bool:
        if self.token is None:
            return False
        try:
            self._revision = await self.store.update(
                self.key, {"holder": self.holder, "at": time.time(), "token": self.token}, self._revision
            )
        except (kv.Conflict, errors.TemporaryError) as e:
            self.log.warning("lease.lost", token=self.token, error=str(e))
            self.token = None
            return False
        self._renewed_at = self.clock()
        return True

    async def release(self) -> None:
        if self.token is None:
            return
        self.token = None
        try:
            await self.store.delete(self.key)
            self.log.info("lease.released")
        except errors.TemporaryError as e:
            self.log.warning("lease.release_failed", error=str(e))

    async def holder_now(self) -> str | None:
        doc = await self.store.get(self.key)
        return str(doc.value.get("holder")) if doc else None

    async def keep(self, stop: asyncio.Event, on_change: Callable[[bool], None] | None = None) -> None:
        """Acquire when free, renew while held, until ``stop``; calls ``on_change(leader)`` on flips."""
        was = False
        while not stop.is_set():
            if self.token is None:
                await self.try_acquire()
            else:
                await self.renew()
            now = self.held
            if now != was and on_change is not None:
                on_change(now)
            was = now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.ttl_s / 3 if now else self.ttl_s / 5)
        await self.release()
        if was and on_change is not None:
            on_change(False)
