"""The scorer's learned state goes into a key-value store in shards small enough for a KV value and
comes back whole, so a restarted controller does not warm up again."""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
from typing import Any

import orjson

from healer.anomaly import scorer_state, scoring
from healer.schemas import codec
from healer.sim import recording


@dataclasses.dataclass(frozen=True)
class Doc:
    value: dict[str, Any]


class MemoryDocs:
    """The get/put half of ``healer.controller.store.kv.Store``, values stored as JSON bytes."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    async def get(self, key: str) -> Doc | None:
        raw = self.data.get(key)
        return None if raw is None else Doc(orjson.loads(raw))

    async def put(self, key: str, value: dict[str, Any]) -> int:
        self.data[key] = orjson.dumps(value)
        return len(self.data)


def _fed(trained: pathlib.Path, rec_path: pathlib.Path, minutes: float) -> tuple[scoring.Scorer, float]:
    scorer = scoring.load(trained)
    next_score: float | None = None
    last = 0.0
    with recording.Recording(rec_path) as rec:
        start = float(rec.meta["start_ts"])
        for ts, frames in rec.frames():
            if ts > start + minutes * 60:
                break
            for _, data in frames:
                scorer.observe(codec.decode_frame(data))
            next_score = ts + 30 if next_score is None else next_score
            if ts >= next_score:
                scorer.score(ts)
                next_score += 30
            last = ts
    return scorer, last


def test_a_restarted_scorer_picks_up_where_the_old_one_left_off(
    trained: pathlib.Path, healthy_recording: pathlib.Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr(scorer_state, "SHARD_NODES", 3)  # the fixture's 8 nodes: three shards
    old, _ = _fed(trained, healthy_recording, 25)
    exported = old.export_state()
    assert old.thermal.ready.any()
    store = MemoryDocs()
    assert asyncio.run(scorer_state.save(store, exported)) == 3
    assert max(len(v) for v in store.data.values()) < 1_000_000
    loaded = asyncio.run(scorer_state.load(store))
    assert loaded is not None
    assert loaded == orjson.loads(orjson.dumps(exported))
    new = scoring.load(trained)
    assert new.import_state(loaded) == len(old.window.node_names)
    new.thermal.ensure(old.window.node_names)  # nodes report again after the restart
    assert (new.thermal.ready == old.thermal.ready).all()
    assert new.export_state() == loaded


def test_nothing_saved_or_another_format_loads_as_nothing() -> None:
    store = MemoryDocs()
    assert asyncio.run(scorer_state.load(store)) is None
    asyncio.run(store.put(scorer_state.DEFAULT_KEY, {"format": "something-else/9"}))
    assert asyncio.run(scorer_state.load(store)) is None
