"""``healer archive`` as a process: it archives, serves /metrics and /readyz, stops on SIGTERM with exit 0,
and refuses an archive of another schema version in one line (exit 2)."""

from __future__ import annotations

import asyncio
import pathlib
import signal
import sqlite3
import sys
import urllib.error
import urllib.request

from healer.bus import embedded
from healer.bus import nats as natsbus
from healer.cli import common
from tests.feed import helpers

HEALER = [sys.executable, "-m", "healer"]


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError):
        return ""


async def test_archive_process_archives_reports_its_counts_and_stops_on_sigterm(
    nats_bus: natsbus.NatsBus,
    nats_server: embedded.EmbeddedServer,
    tmp_path: pathlib.Path,
    procs: list[asyncio.subprocess.Process],
) -> None:
    for n in range(3):
        await helpers.publish(nats_bus, helpers.event(n))
    db, port = tmp_path / "archive.db", embedded.free_port()
    p = await asyncio.create_subprocess_exec(
        *HEALER, "archive", "--nats", nats_server.url, "--db", str(db), "--metrics-port", str(port),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    procs.append(p)
    url = f"http://127.0.0.1:{port}"

    async def archived_and_ready() -> bool:
        metrics = await asyncio.to_thread(_get, f"{url}/metrics")
        ready = await asyncio.to_thread(_get, f"{url}/readyz")
        return 'healer_archive_events_total{result="stored"} 3.0' in metrics and '"ready": true' in ready

    async with asyncio.timeout(30):
        while not await archived_and_ready():  # noqa: ASYNC110 - polling another process is the point
            await asyncio.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(p.communicate(), 20)
    assert p.returncode == 0, err.decode()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM incidents").fetchone() == (3,)


async def test_an_archive_of_another_schema_is_refused_in_one_line(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "archive.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '7')")
    p = await asyncio.create_subprocess_exec(
        *HEALER, "archive", "--nats", "nats://127.0.0.1:1", "--db", str(db),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(p.communicate(), 30)
    assert p.returncode == common.EXIT_USAGE
    assert err.decode().strip().splitlines() == [
        f"healer archive: {db} holds archive schema 7; this healer reads and writes 1"
    ]
