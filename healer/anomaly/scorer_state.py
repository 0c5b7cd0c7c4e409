"""Keeping what the scorer has learned about a fleet across controller restarts and failover.

The scorer's state (``Scorer.export_state()``: per node, its GPUs' thermal fits and its inlet level)
is a JSON-able dict that grows with the fleet: about 1 KB per 8-GPU node, 10 MB at 10,000 nodes, more
than one JetStream KV value may hold (1 MB by default). ``save`` splits it into a manifest under
``key`` and shards of ``SHARD_NODES`` nodes under ``key.0``, ``key.1`` ...; ``load`` puts it back
together. Shards are written before the manifest, so a reader never sees a manifest whose shards are
missing; a crash between them leaves the previous manifest pointing at shards of which some may be
newer, which is harmless (each node's entry is whole).

Any store with ``get(key) -> doc | None`` (``doc.value`` the dict) and ``put(key, dict)`` works: the
controller's ``healer.controller.kv.Store`` has that shape.
"""

from __future__ import annotations

import time
from typing import Any, Final, Protocol

from healer.anomaly import thermal

DEFAULT_KEY: Final = "anomaly.state"
SHARD_NODES: Final = 256
"""Nodes per KV value (about 300 KB of JSON at 8 GPUs per node)."""


class _Doc(Protocol):
    @property
    def value(self) -> dict[str, Any]: ...


class DocStore(Protocol):
    async def get(self, key: str) -> _Doc | None: ...

    async def put(self, key: str, value: dict[str, Any]) -> int: ...


async def save(store: DocStore, state: dict[str, Any], key: str = DEFAULT_KEY) -> int:
    """Write ``state`` (``Scorer.export_state()``) as shards and a manifest; returns the shard count."""
    names = sorted(state.get("nodes", {}))
    shards = [names[i : i + SHARD_NODES] for i in range(0, len(names), SHARD_NODES)]
    for k, part in enumerate(shards):
        await store.put(f"{key}.{k}", {"nodes": {n: state["nodes"][n] for n in part}})
    manifest = {k: v for k, v in state.items() if k != "nodes"}
    manifest.update(shards=len(shards), nodes=len(names), saved_at=time.time())
    await store.put(key, manifest)
    return len(shards)


async def load(store: DocStore, key: str = DEFAULT_KEY) -> dict[str, Any] | None:
    """The saved state (for ``Scorer.import_state``), or None when nothing was saved or it is of another
    format. A missing shard loses its nodes only (they learn again)."""
    doc = await store.get(key)
    if doc is None or doc.value.get("format") != thermal.STATE_FORMAT:
        return None
    manifest = doc.value
    nodes: dict[str, Any] = {}
    for k in range(int(manifest.get("shards", 0))):
        shard = await store.get(f"{key}.{k}")
        if shard is not None:
            nodes.update(shard.value.get("nodes", {}))
    out = {k: v for k, v in manifest.items() if k not in ("shards", "saved_at")}
    out["nodes"] = nodes
    return out
