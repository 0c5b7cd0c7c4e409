"""JSON documents in a key-value bucket of the bus (``base.KeyValue``), with compare-and-set.

The controller keeps everything that must survive a restart here (open incidents, the breaker, the
exclusions) rather than on local disk, so a standby that takes over sees exactly what the old leader saw.
The bucket is the bus's: JetStream KV on NATS, its in-memory twin in tests; either way failures arrive as
``errors.TemporaryError`` / ``errors.PermanentError`` and a lost compare-and-set as ``Conflict``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import orjson

from healer import errors
from healer.bus import base

Conflict = base.KeyConflict
"""Compare-and-set lost: someone else wrote the key first."""


@dataclasses.dataclass(frozen=True, slots=True)
class Doc:
    key: str
    value: dict[str, Any]
    revision: int


IN_FLIGHT = 64
"""KV calls one ``Store`` has in flight at most; the rest wait their turn before they are sent. A burst's
thousand concurrent writes would otherwise all wait on the server and the client's reply handling at
once, and on a loaded machine run into the client's timeout (#43)."""


class Store:
    def __init__(self, kv: base.KeyValue) -> None:
        self.kv = kv
        self._gate = asyncio.Semaphore(IN_FLIGHT)

    async def get(self, key: str) -> Doc | None:
        async with self._gate:
            entry = await self.kv.get(key)
        if entry is None:
            return None
        try:
            value = orjson.loads(entry.value)
        except orjson.JSONDecodeError as e:
            raise errors.PermanentError(f"KV {key} holds invalid JSON: {e}") from e
        return Doc(key, value, entry.revision)

    async def put(self, key: str, value: dict[str, Any]) -> int:
        async with self._gate:
            return await self.kv.put(key, orjson.dumps(value))

    async def create(self, key: str, value: dict[str, Any]) -> int:
        """Write only if the key does not exist; ``Conflict`` otherwise."""
        async with self._gate:
            return await self.kv.create(key, orjson.dumps(value))

    async def update(self, key: str, value: dict[str, Any], revision: int) -> int:
        """Write only if the key is still at ``revision``; ``Conflict`` otherwise."""
        async with self._gate:
            return await self.kv.update(key, orjson.dumps(value), revision)

    async def delete(self, key: str) -> None:
        async with self._gate:
            await self.kv.delete(key)

    async def keys(self, prefix: str = "") -> list[str]:
        """The keys starting with ``prefix``; a prefix that ends with a dot is listed by the server alone
        (a burst's thousands of incidents are not read to find the few ``close.`` keys each tick, #43)."""
        async with self._gate:
            listed = await self.kv.keys(prefix)
        return sorted(k for k in listed if k.startswith(prefix))


class Prefixed(Store):
    """The same bucket under a key prefix (the dry-run breaker, and the dry-run and observe limits, keep
    their own state)."""

    def __init__(self, store: Store, prefix: str) -> None:
        super().__init__(store.kv)
        self._gate = store._gate  # one bucket, one bound
        self.prefix = prefix

    async def get(self, key: str) -> Doc | None:
        return await super().get(self.prefix + key)

    async def put(self, key: str, value: dict[str, Any]) -> int:
        return await super().put(self.prefix + key, value)

    async def create(self, key: str, value: dict[str, Any]) -> int:
        return await super().create(self.prefix + key, value)

    async def update(self, key: str, value: dict[str, Any], revision: int) -> int:
        return await super().update(self.prefix + key, value, revision)
