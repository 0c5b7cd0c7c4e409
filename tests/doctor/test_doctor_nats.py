"""``healer doctor``'s NATS checks against a real nats-server running the authorization that
``healer nats config`` generates: the node's identity may publish its own events and not another node's,
and the probe stores nothing. Without authorization every publish is allowed, which the doctor says."""

from __future__ import annotations

import asyncio
import json
import pathlib
import time
from collections.abc import Iterator

import nats
import pytest

from healer import cli, config
from healer.agent import doctor, doctor_nats
from healer.bus import embedded, probe, provision, subjects
from healer.bus import nats as natsbus
from healer.security import natsconf
from healer.telemetry import nvml
from tests.fakes import fake_pynvml

pytestmark = pytest.mark.nats

NODE = "gpu-017"
SUBJ = subjects.Subjects()
Status = doctor.Status


class Secured:
    def __init__(self, srv: embedded.EmbeddedServer, result: natsconf.Result) -> None:
        self.srv = srv
        self.result = result

    def settings(self, role: str, name: str) -> config.Settings:
        s = config.load(self.result.settings_files[(role, name)], env={})
        return s.model_copy(update={"nats": s.nats.model_copy(update={"url": self.srv.url})})

    @property
    def monitor(self) -> str:
        return f"http://{self.srv.host}:{self.srv.monitor_port}"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base = tmp_path_factory.mktemp("doctor-nats")
    result = natsconf.generate(natsconf.Inventory(nodes=[NODE, "gpu-018"]), base / "auth")
    srv = embedded.EmbeddedServer(base / "nats", extra_config=result.auth_conf.read_text())
    srv.start()
    try:
        fleet = Secured(srv, result)

        async def provision_as_controller() -> None:
            ns = fleet.settings("controller", "controller").nats
            bus = await natsbus.NatsBus.connect(srv.url, name="ctl", nats_settings=ns)
            try:
                await provision.ensure(bus, SUBJ, config.NatsSettings())
            finally:
                await bus.close()

        asyncio.run(provision_as_controller())
        yield fleet
    finally:
        srv.stop()


async def events_stored(fleet: Secured) -> int:
    ns = fleet.settings("controller", "controller").nats
    nc = await nats.connect(fleet.srv.url, nkeys_seed=ns.nkey_seed_file, inbox_prefix=ns.inbox_prefix)
    try:
        info = await nc.jetstream().stream_info(SUBJ.stream_events)
        return int(info.state.messages)
    finally:
        await nc.close()


def by_id(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {c.id: c for c in checks}


async def test_the_nodes_identity_may_publish_its_own_events_and_not_anothers(secured: Secured) -> None:
    before = await events_stored(secured)
    checks = by_id(await doctor_nats.run(secured.settings("node", NODE), NODE, secured.monitor))
    assert checks["nats.connect"].status is Status.OK
    assert "with its identity" in checks["nats.connect"].summary
    own = checks["nats.publish_own"]
    assert own.status is Status.OK, own
    assert own.data["subject"] == SUBJ.events(NODE)
    assert "JetStream refused" in own.data["detail"]
    other = checks["nats.publish_other"]
    assert other.status is Status.OK
    assert "refused" in other.summary
    assert await events_stored(secured) == before, "the probe stored nothing"
    clock = checks["nats.clock"]
    assert clock.status is Status.OK
    assert abs(clock.data["offset_s"]) < 1.0


async def test_another_nodes_seed_cannot_publish_as_this_node(secured: Secured) -> None:
    """The seed of gpu-018 used with --node gpu-017: the node's own subject is refused."""
    checks = by_id(await doctor_nats.run(secured.settings("node", "gpu-018"), NODE, None))
    assert checks["nats.publish_own"].status is Status.FAIL
    assert "Permissions Violation" in checks["nats.publish_own"].summary


async def test_a_wrong_seed_is_refused_at_connect(secured: Secured, tmp_path: pathlib.Path) -> None:
    s = secured.settings("node", NODE)
    stranger = tmp_path / "stranger.nk"
    stranger.write_bytes(natsconf.new_seed())
    stranger.chmod(0o600)
    s = s.model_copy(update={"nats": s.nats.model_copy(update={"nkey_seed_file": str(stranger)})})
    checks = by_id(await doctor_nats.run(s, NODE, None, timeout_s=2.0))
    assert checks["nats.connect"].status is Status.FAIL
    assert "nats.publish_own" not in checks


async def test_a_server_without_authorization_lets_anyone_publish(
    nats_server: embedded.EmbeddedServer,
) -> None:
    s = config.Settings().model_copy(update={"nats": config.NatsSettings(url=nats_server.url)})
    checks = by_id(await doctor_nats.run(s, NODE, None))
    assert checks["nats.connect"].summary.endswith("WITHOUT credentials")
    assert checks["nats.publish_own"].status is Status.OK
    assert "no stream" in checks["nats.publish_own"].summary
    assert checks["nats.publish_other"].status is Status.WARN


async def test_without_the_monitor_the_leader_lease_bounds_the_clock(secured: Secured) -> None:
    """The node reads the newest lease message's server time (all JetStream lets it read): the offset lies
    within the lease TTL of it; a clock 30 s behind is beyond any doubt."""
    ns = secured.settings("controller", "controller").nats
    ctl = await natsbus.NatsBus.connect(secured.srv.url, name="ctl", nats_settings=ns)
    try:
        kv = await ctl.key_value(SUBJ.kv_leases)
        await kv.put("leader.shard-0", b'{"holder": "controller"}')
    finally:
        await ctl.close()
    node = secured.settings("node", NODE)
    checks = by_id(await doctor_nats.run(node, NODE, None))
    clock = checks["nats.clock"]
    assert clock.status is Status.OK, clock
    assert clock.data["offset_low_s"] <= 0.0 <= clock.data["offset_high_s"] + 0.5
    assert clock.data["offset_high_s"] - clock.data["offset_low_s"] == pytest.approx(node.nats.lease_ttl_s)
    nc, _ = await probe.connect(secured.srv.url, node.nats, "clock-test")
    try:
        behind = await probe.lease_clock(
            nc, SUBJ.lease_read_api, SUBJ.lease_subject("leader.shard-0"), node.nats.lease_ttl_s, 3.0,
            clock=lambda: time.time() - 30.0,
        )  # fmt: skip
    finally:
        await nc.close()
    assert behind is not None
    verdict = doctor_nats._bounded(behind)
    assert verdict.status is Status.WARN
    assert "off the server" in verdict.summary


def test_the_server_time_parses_with_nanoseconds() -> None:
    assert probe.parse_time("2026-12-07T06:20:30.123456789Z") == pytest.approx(1796624430.123456789)
    assert probe.parse_time("2026-12-07T07:20:30+01:00") == pytest.approx(1796624430.0)


def test_healer_doctor_json_on_the_command_line(
    secured: Secured,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The command reads the node's settings fragment and prints the versioned report; exit as it says."""
    fake = fake_pynvml.FakeNvml(2)
    monkeypatch.setattr(nvml, "load_pynvml", fake.module)
    (tmp_path / "sys").mkdir()
    fragment = str(secured.result.settings_files[("node", NODE)])
    argv = ["doctor", "--json", "--node", NODE, "--config", fragment, "--nats", secured.srv.url,
            "--nats-monitor", secured.monitor, "--sysfs-root", str(tmp_path / "sys"),
            "--gpus-expected", "2", "--write-test"]  # fmt: skip
    code = cli.main(argv)
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "healer.doctor.v1"
    assert report["exit_code"] == code
    ids = {c["id"]: c for c in report["checks"]}
    assert ids["nats.publish_own"]["status"] == "ok"
    assert ids["nats.publish_other"]["status"] == "ok"
    assert ids["nvml.gpus"]["data"] == {"found": 2, "expected": 2}
    assert [c["status"] for c in report["checks"] if c["id"] == "nvml.power_write"] == ["ok", "ok"]
