"""Training from the HEALER_TELEMETRY stream of a real nats-server (a few hundred frames)."""

from __future__ import annotations

import asyncio
import json
import pathlib

import pytest

from healer import cli, config
from healer.anomaly import dataset, features
from healer.bus import embedded, provision, subjects
from healer.bus import nats as natsbus
from healer.sim import recording
from tests.anomaly import conftest

pytestmark = pytest.mark.nats


async def _publish(url: str, rec_path: pathlib.Path) -> int:
    subj = subjects.Subjects()
    bus = await natsbus.NatsBus.connect(url, name="test-publisher")
    try:
        await provision.ensure(bus, subj, config.NatsSettings())
        count = 0
        with recording.Recording(rec_path) as rec:
            for _, frames in rec.frames():
                for node, data in frames:
                    await bus.publish(subj.telemetry(rec.node_names[node]), data)
                    count += 1
        await bus.publish(subj.telemetry("junk"), b"not a frame")
        await bus.flush()
        # Core publishes are captured by the stream asynchronously: wait until all are stored.
        async with asyncio.timeout(30):
            while (await bus.js.stream_info(subj.stream_telemetry)).state.messages < count + 1:  # noqa: ASYNC110 - polling the server
                await asyncio.sleep(0.05)
        return count + 1
    finally:
        await bus.close()


def test_stream_frames_are_read_in_order_and_become_windows(
    nats_server: embedded.EmbeddedServer, tmp_path: pathlib.Path
) -> None:
    rec_path = conftest.record(tmp_path / "h.npz", "healthy", nodes=4, minutes=8, seed=21)
    sent = asyncio.run(_publish(nats_server.url, rec_path))
    assert 300 <= sent <= 500
    frames = asyncio.run(dataset.stream_frames(nats_server.url, subjects.Subjects()))
    assert len(frames) == sent
    windows, bad = dataset.from_frames(frames)
    assert bad == 1
    assert windows.node_names == [f"sim-{i:05d}" for i in range(4)]
    assert windows.valid[-1].all()
    assert windows.feats.shape[-1] == len(features.BASE_FEATURES)

    out = tmp_path / "model"
    assert (
        cli.main(["model", "train", "--from-stream", nats_server.url, "--out", str(out), "--trees", "10"])
        == 0
    )
    card = json.loads((out / "card.json").read_text())
    assert card["training_data"]["sources"] == ["stream:HEALER_TELEMETRY"]
    assert card["training_data"]["nodes"] == 4
