"""`healer controller` as real processes: SIGKILL the leader, the standby acts once; the operator
commands `healer breaker` and `healer exclude` work against the same KV."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import subprocess
import sys

import orjson

from healer import config
from healer.bus import embedded, provision, subjects
from healer.bus import nats as natsbus
from tests.controller.conftest import DBE_RULES, Feed, Fleet, run_until, warm

HEALER = [sys.executable, "-m", "healer"]


def start_controller(url: str, rules: pathlib.Path, log: pathlib.Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "HEALER_NATS_LEASE_TTL_S": "2",
        "HEALER_LOG_FORMAT": "json",
        "HEALER_CONTROLLER_ADMISSION": "first-seen",
    }
    with log.open("ab") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            [*HEALER, "controller", "--nats", url, "--rules", str(rules), "--mode", "enforce", "--actuator",
             "log", "--tick", "0.2", "--metrics-port", "0"],
            env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


async def leader_pid(bus: natsbus.NatsBus) -> int | None:
    kv = await bus.js.key_value("healer-leases")
    try:
        entry = await kv.get("leader.shard-0")
    except Exception:
        return None
    if not entry.value:
        return None
    holder = str(orjson.loads(entry.value)["holder"])
    return int(holder.split("-")[-2])


def started(log: pathlib.Path) -> bool:
    """The controller logged ``controller.started``: it is subscribed to the fleet's frames
    (``Ingest.subscribe`` made a round trip first), so every frame published from now on reaches it."""
    if not log.exists():
        return False
    lines = log.read_bytes().split(b"\n")[:-1]  # whole lines only: the child may be writing one now
    return any(
        line.startswith(b"{") and orjson.loads(line).get("event") == "controller.started" for line in lines
    )


async def test_sigkilled_leader_is_replaced_and_no_action_runs_twice(
    nats_server: embedded.EmbeddedServer, tmp_path: pathlib.Path
) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "dbe.yaml").write_text(DBE_RULES)
    bus = await natsbus.NatsBus.connect(nats_server.url)
    await provision.ensure(bus, subjects.Subjects(), config.NatsSettings(lease_ttl_s=2))
    feed = Feed()
    await bus.subscribe("healer.incidents.>", feed)
    logs = [tmp_path / f"c{i}.log" for i in range(2)]
    procs = [start_controller(nats_server.url, rules, log) for log in logs]
    try:
        fleet = Fleet(bus, ["n1", "n2"])
        pid: int | None = None

        def ready() -> bool:
            return pid in {p.pid for p in procs} and all(started(log) for log in logs)

        # Both must be running before the leader dies: elected is not enough, the other process may
        # still be starting on a loaded machine (seconds of imports), and a standby that subscribes after
        # the fault sees a counter already at 1, no increase (the rule's baseline), and opens nothing.
        async with asyncio.timeout(60):
            while not ready():
                pid = await leader_pid(bus)
                await fleet.publish()
                await asyncio.sleep(0.2)
        leader = next(p for p in procs if p.pid == pid)
        standby = next(p for p in procs if p.pid != pid)
        await warm(fleet)  # after both subscribed: the standby's counters have their baseline
        leader.send_signal(signal.SIGKILL)
        leader.wait(10)
        fleet.overrides[("n1", 0)] = {"ecc_dbe_volatile": 1}
        # No duration is asserted: the wait gives up at 30 s (fifteen lease TTLs: two controller
        # processes, a server and this test may share two loaded cores), so acting at all means the
        # standby took over and acted within it.
        await run_until(fleet, lambda: feed.changes("n1").count("action") >= 2, timeout=30)
        for _ in range(10):
            await fleet.publish()
            await asyncio.sleep(0.2)
        assert standby.poll() is None
        assert await leader_pid(bus) == standby.pid
        assert feed.changes("n1").count("opened") == 1
        actions = [e.data.actions for e in feed.events if e.change == "action"]
        assert [(a.kind, a.status) for a in actions[-1]] == [("cordon", "done"), ("migrate", "done")]
        assert len(actions) == 2, "each action executed and published exactly once"
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        await bus.close()


def test_operator_commands_for_breaker_and_exclusions(nats_server: embedded.EmbeddedServer) -> None:
    def healer(*args: str) -> str:
        done = subprocess.run(
            [*HEALER, *args, "--nats", nats_server.url], capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    healer("nats", "provision")  # admin commands never create the state bucket themselves
    assert '"open": false' in healer("breaker", "status", "--json")
    assert healer("breaker", "status").startswith("breaker closed\n0 node(s)")
    assert healer("exclude", "list") == "no nodes excluded\n"
    assert healer("exclude", "add", "gpu-07", "--reason", "PSU swap").startswith("excluded gpu-07: PSU swap")
    listed = healer("exclude", "list")
    assert "gpu-07" in listed
    assert "PSU swap" in listed
    assert " UTC (" in listed  # when, as people read it
    assert healer("exclude", "remove", "gpu-07") == "gpu-07 is no longer excluded\n"
    assert healer("exclude", "list") == "no nodes excluded\n"
    reset = healer("breaker", "reset")
    assert reset.startswith("breaker reset by ")
    assert "closed, window cleared" in reset
    status = healer("breaker", "status")
    assert "last reset by" in status
    assert " UTC (" in status
    assert healer("ladder", "status") == "no recovery ladders in flight\n"
