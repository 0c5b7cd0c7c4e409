"""JSON documents in a JetStream KV bucket, with compare-and-set, and nats-py errors translated.

The controller keeps everything that must survive a restart here (open incidents, the breaker, the
exclusions) rather than on local disk, so a standby that takes over sees exactly what the old leader saw.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import nats.errors
import nats.js.errors
import orjson
from nats.js.kv import KeyValue

from healer import errors
from healer.bus import nats as natsbus

_NATS_FAILURES = (nats.errors.Error, OSError, TimeoutError)


def _translate(what: str, e: BaseException) -> errors.HealerError:
    """What "try again" means is decided once, in ``natsbus.is_temporary`` (503s, no stream response,
    leader elections, timeouts, a reconnecting client); anything else is permanent."""
    if natsbus.is_temporary(e):
        return errors.TemporaryError(f"{what}: {e!r}")
    return errors.PermanentError(f"{what}: {e!r}")


class Conflict(errors.HealerError):
    """Compare-and-set lost: someone else wrote the key first."""


@dataclasses.dataclass(frozen=True, slots=True)
class Doc:
    key: str
    value: dict[str, Any]
    revision: int


class Store:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    async def get(self, key: str) -> Doc | None:
        try:
            entry = await self.kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        except _NATS_FAILURES as e:
            raise _translate(f"KV get {key}", e) from e
        if entry.value is None:
            return None
        try:
            value = orjson.loads(entry.value)
        except orjson.JSONDecodeError as e:
            raise errors.PermanentError(f"KV {key} holds invalid JSON: {e}") from e
        return Doc(key, value, int(entry.revision or 0))

    async def put(self, key: str, value: dict[str, Any]) -> int:
        try:
            return int(await self.kv.put(key, orjson.dumps(value)))
        except _NATS_FAILURES as e:
            raise _translate(f"KV put {key}", e) from e

    async def create(self, key: str, value: dict[str, Any]) -> int:
        """Write only if the key does not exist; ``Conflict`` otherwise."""
        try:
            return int(await self.kv.create(key, orjson.dumps(value)))
        except nats.js.errors.KeyWrongLastSequenceError as e:
            raise Conflict(f"{key} exists") from e
        except _NATS_FAILURES as e:
            raise _translate(f"KV create {key}", e) from e

    async def update(self, key: str, value: dict[str, Any], revision: int) -> int:
        """Write only if the key is still at ``revision``; ``Conflict`` otherwise."""
        try:
            return int(await self.kv.update(key, orjson.dumps(value), last=revision))
        except nats.js.errors.KeyWrongLastSequenceError as e:
            raise Conflict(f"{key} changed since revision {revision}") from e
        except _NATS_FAILURES as e:
            raise _translate(f"KV update {key}", e) from e

    async def delete(self, key: str) -> None:
        try:
            await self.kv.delete(key)
        except _NATS_FAILURES as e:
            raise _translate(f"KV delete {key}", e) from e

    async def keys(self, prefix: str = "") -> list[str]:
        try:
            found = await self.kv.keys()
        except nats.js.errors.NoKeysError:
            return []
        except _NATS_FAILURES as e:
            raise _translate("KV keys", e) from e
        return sorted(k for k in found if k.startswith(prefix))
