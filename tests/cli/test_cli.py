"""The shipped commands, run as a person would: `healer agent` and `healer telemetry watch` as
processes against a real nats-server, stopped with SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request

from healer import cli
from healer.bus import embedded
from healer.bus import nats as natsbus
from healer.schemas import codec
from tests import conftest

HEALER = [sys.executable, "-m", "healer"]


def test_help_lists_every_command_group() -> None:
    parser = cli.build_parser()
    text = parser.format_help()
    for group in ["agent", "nats", "telemetry", "schema"]:
        assert group in text


def test_agent_process_streams_frames_serves_metrics_and_stops_cleanly(
    nats_server: embedded.EmbeddedServer, tmp_path: pathlib.Path
) -> None:
    port = embedded.free_port()
    env = {**os.environ, "HEALER_LOG_FORMAT": "json"}
    agent = subprocess.Popen(
        [*HEALER, "agent", "--nats", nats_server.url, "--node", "cli-node", "--source", "sim", "--interval",
         "0.1", "--sim-gpus", "4", "--state-dir", str(tmp_path / "state"), "--metrics-port", str(port),
         "--provision"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        watch = subprocess.run(
            [*HEALER, "telemetry", "watch", "--nats", nats_server.url, "--node", "cli-node", "--count", "3",
             "--json"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert watch.returncode == 0, watch.stderr
        frames = [codec.decode_frame(line) for line in watch.stdout.splitlines()]
        assert len(frames) == 3
        assert all(f.node == "cli-node" and len(f.gpus) == 4 for f in frames)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
        assert "healer_agent_frames_published_total" in body
    finally:
        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=20)
    assert agent.returncode == 0, out.decode()[-2000:]
    assert asyncio.run(event_kinds(nats_server.url, "healer.events.cli-node")) == [
        "agent_start",
        "agent_stop",
    ]


async def event_kinds(url: str, subject: str) -> list[str]:
    bus = await natsbus.NatsBus.connect(url)
    try:
        return [codec.decode_event(d).kind for d in await conftest.read_stream(bus, subject)]
    finally:
        await bus.close()


def subscribed(srv: embedded.EmbeddedServer, subject: str) -> bool:
    """Has some client subscribed to ``subject``? (the server's own monitoring endpoint)"""
    url = f"http://{srv.host}:{srv.monitor_port}/connz?subs=1"
    with urllib.request.urlopen(url, timeout=5) as resp:
        conns = json.loads(resp.read())["connections"] or []
    return any(subject in (c.get("subscriptions_list") or []) for c in conns)


def test_watch_survives_garbage_and_counts_it(
    nats_server: embedded.EmbeddedServer, tmp_path: pathlib.Path
) -> None:
    watch = subprocess.Popen(
        [*HEALER, "telemetry", "watch", "--nats", nats_server.url, "--count", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not subscribed(nats_server, "healer.telemetry.*"):
            assert time.monotonic() < deadline, "healer telemetry watch never subscribed"
            assert watch.poll() is None, watch.communicate()
            time.sleep(0.1)
        publisher = f"""
import asyncio, time
from healer.bus import nats as nb
from healer.sim import node_source
from healer.schemas import telemetry, codec
async def main():
    bus = await nb.NatsBus.connect("{nats_server.url}")
    for junk in [b"{{", b'{{"schema":"healer.telemetry.v9"}}', b"\\xff" * 10]:
        await bus.publish("healer.telemetry.x", junk)
    f = telemetry.NodeFrame(node="ok", ts=time.time(), seq=0, boot_id="b", agent_version="t", source="sim",
                            gpus=node_source.SimSource("ok", gpus=1).sample().gpus)
    await bus.publish("healer.telemetry.ok", codec.encode(f))
    await bus.close()
asyncio.run(main())
"""
        subprocess.run([sys.executable, "-c", publisher], check=True, timeout=60)
        out, err = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.communicate()
    assert watch.returncode == 0
    assert out.startswith("ok seq=0 gpus=1")
    assert "rejected 3 messages (frame/json=2, frame/schema_version=1)" in err
