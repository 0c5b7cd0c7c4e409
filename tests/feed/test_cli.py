"""``healer incidents tail`` and ``healer forward`` as processes, stopped with signals as a person would."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import urllib.request

from healer.bus import embedded
from healer.bus import nats as natsbus
from healer.schemas import codec, incidents
from tests import conftest
from tests.feed import helpers

HEALER = [sys.executable, "-m", "healer"]


async def healer(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    p = await asyncio.create_subprocess_exec(
        *HEALER, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    out, err = await asyncio.wait_for(p.communicate(), 30)
    assert p.returncode is not None
    return p.returncode, out.decode(), err.decode()


async def test_tail_prints_json_and_lines_and_reports_garbage(
    nats_bus: natsbus.NatsBus, nats_server: embedded.EmbeddedServer
) -> None:
    events = [helpers.event(0, severity="warning"), helpers.event(1, severity="critical", node="n2")]
    await helpers.publish(nats_bus, events[0])
    await helpers.publish_raw(nats_bus, helpers.SUBJ.incident(incidents.Change.OPENED, "n2"), b"{oops")
    await helpers.publish(nats_bus, events[1])

    rc, out, err = await healer("incidents", "tail", "--nats", nats_server.url, "--json")
    assert rc == 0, err
    assert out.splitlines() == [codec.encode(ev).decode() for ev in events]
    assert "rejected seq=2 on healer.incidents.opened.n2" in err
    assert "rejected 1 malformed messages (cloudevent/json=1)" in err

    rc, out, err = await healer("incidents", "tail", "--nats", nats_server.url, "--severity", "critical")
    assert rc == 0, err
    assert out.splitlines() == [helpers.tail_line(events[1])]

    rc, out, err = await healer("incidents", "tail", "--nats", nats_server.url, "--since", "next tuesday")
    assert rc == 2
    assert "cannot read time" in err

    rc, out, err = await healer("forward", "--nats", nats_server.url, "--url", "ftp://example/x")
    assert rc == 2
    assert "must be http:// or https://" in err


async def test_tail_follow_sees_new_events_and_exits_cleanly_on_sigterm(
    nats_bus: natsbus.NatsBus, nats_server: embedded.EmbeddedServer, procs: list[asyncio.subprocess.Process]
) -> None:
    await helpers.publish(nats_bus, helpers.event(0))
    p = await asyncio.create_subprocess_exec(
        *HEALER, "incidents", "tail", "--nats", nats_server.url, "--follow", "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    procs.append(p)
    assert p.stdout is not None
    first = await asyncio.wait_for(p.stdout.readline(), 30)
    assert codec.decode_incident(first).id == "ev-0"
    await helpers.publish(nats_bus, helpers.event(1, change=incidents.Change.RESOLVED))
    second = await asyncio.wait_for(p.stdout.readline(), 30)
    assert codec.decode_incident(second).id == "ev-1"
    p.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(p.communicate(), 20)
    assert p.returncode == 0, err.decode()


async def test_killed_forwarder_resumes_from_its_durable_consumer_without_loss_or_skips(
    nats_bus: natsbus.NatsBus, nats_server: embedded.EmbeddedServer, procs: list[asyncio.subprocess.Process]
) -> None:
    hold = {"ev-2": 503}
    receiver = helpers.Receiver(embedded.free_port(), answer=lambda ce_id: hold.get(ce_id or "", 200))
    receiver.start()
    env = {**os.environ, "HEALER_FEED_ACK_WAIT_S": "1", "HEALER_FEED_RETRY_INITIAL_DELAY_S": "0.05",
           "HEALER_FEED_RETRY_MAX_DELAY_S": "0.2", "HEALER_FEED_FETCH_TIMEOUT_S": "0.5",
           "HEALER_LOG_FORMAT": "json"}  # fmt: skip
    metrics_port = embedded.free_port()
    args = [*HEALER, "forward", "--nats", nats_server.url, "--url", receiver.url, "--durable", "audit",
            "--metrics-port", str(metrics_port)]  # fmt: skip

    async def start() -> asyncio.subprocess.Process:
        p = await asyncio.create_subprocess_exec(
            *args, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        procs.append(p)
        return p

    try:
        for n in range(3):
            await helpers.publish(nats_bus, helpers.event(n))
        first = await start()
        await conftest.until(lambda: receiver.attempts("ev-2") >= 2, timeout=30)  # stuck on ev-2
        first.kill()
        await first.wait()
        for n in range(3, 6):
            await helpers.publish(nats_bus, helpers.event(n))
        hold.clear()
        second = await start()
        await conftest.until(lambda: len(receiver.accepted_ids()) == 6, timeout=30)
        metrics = await asyncio.to_thread(_get, f"http://127.0.0.1:{metrics_port}/metrics")
        second.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(second.communicate(), 20)
        assert second.returncode == 0, err.decode()[-2000:]
    finally:
        receiver.stop()
    assert receiver.accepted_ids() == [f"ev-{n}" for n in range(6)]
    assert [receiver.attempts(f"ev-{n}") for n in (0, 1)] == [1, 1], "acknowledged events are not resent"
    assert "healer_forward_delivered_total 4.0" in metrics
    assert "healer_forward_redelivered_total 1.0" in metrics
    info = await nats_bus.js.consumer_info(helpers.SUBJ.stream_incidents, "audit")
    assert (info.num_pending, info.num_ack_pending) == (0, 0)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


async def test_forward_content_mode_binary_sends_attributes_as_ce_headers(
    nats_bus: natsbus.NatsBus, nats_server: embedded.EmbeddedServer, procs: list[asyncio.subprocess.Process]
) -> None:
    receiver = helpers.Receiver(embedded.free_port())
    receiver.start()
    env = {**os.environ, "HEALER_FEED_FETCH_TIMEOUT_S": "0.5", "HEALER_LOG_FORMAT": "json"}
    args = [*HEALER, "forward", "--nats", nats_server.url, "--url", receiver.url, "--content-mode", "binary"]
    ev = helpers.event(1)
    await helpers.publish(nats_bus, ev)
    p = await asyncio.create_subprocess_exec(
        *args, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    procs.append(p)
    try:
        await conftest.until(lambda: len(receiver.snapshot()) == 1, timeout=30)
        p.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(p.communicate(), 20)
    finally:
        receiver.stop()
    assert p.returncode == 0, err.decode()[-2000:]
    [req] = receiver.snapshot()
    headers = {k.lower(): v for k, v in req.headers.items()}
    assert (headers["ce-id"], headers["ce-type"], headers["ce-specversion"]) == (ev.id, ev.type, "1.0")
    assert headers["content-type"] == "application/json"
    assert json.loads(req.body) == json.loads(codec.encode(ev.data)), "the body is data alone"
