"""What an outage and a clean exit look like in the log (issue #23): one line when the connection is
lost, one line per reconnection attempt, one when it is back, and a clean ``close`` is no warning.
Against a real nats-server, stopped and started again."""

from __future__ import annotations

import asyncio

import structlog

from healer import config
from healer.bus import embedded
from healer.bus import nats as natsbus


async def _until(cond: object, timeout_s: float = 30.0) -> None:
    async def wait() -> None:
        while not cond():  # type: ignore[operator]  # noqa: ASYNC110 - log lines have no event to wait on
            await asyncio.sleep(0.05)

    await asyncio.wait_for(wait(), timeout_s)


async def test_an_outage_logs_one_line_per_attempt_and_a_clean_close_no_warning(
    nats_server: embedded.EmbeddedServer,
) -> None:
    ns = config.NatsSettings(url=nats_server.url, reconnect_wait_s=0.2)
    with structlog.testing.capture_logs() as logs:
        bus = await natsbus.NatsBus.connect(nats_server.url, name="t", nats_settings=ns)
        try:
            nats_server.stop()
            await _until(lambda: sum(e["event"] == "nats.reconnect_failed" for e in logs) >= 3)
            nats_server.start()
            await _until(lambda: any(e["event"] == "nats.reconnected" for e in logs))
            outage = [e for e in logs if e["log_level"] in ("warning", "error")]
        finally:
            before_close = len(logs)
            await bus.close()
    lost = [e for e in outage if e["event"] == "nats.disconnected"]
    attempts = [e for e in outage if e["event"] == "nats.reconnect_failed"]
    assert len(lost) == 1, outage
    assert "EOF" in str(lost[0]["error"])  # why, on the same line
    assert len(outage) == len(lost) + len(attempts), f"only those lines, one per attempt: {outage}"
    numbers = [e["attempt"] for e in attempts]
    assert numbers == list(range(1, len(numbers) + 1)), numbers
    closing = logs[before_close:]
    assert [e for e in closing if e["log_level"] in ("warning", "error")] == [], closing
    assert [e["event"] for e in closing] == ["nats.closed"]
