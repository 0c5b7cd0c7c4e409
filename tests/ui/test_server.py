"""The status page's server: security (loopback, token, read-only, nothing from outside) and its live
sources against a real nats-server (the breaker and exclusions pushed from KV, incidents seeded from KV,
nothing ever written)."""

from __future__ import annotations

import asyncio
import pathlib
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from healer import cli, config, errors
from healer.bus import embedded, subjects
from healer.bus import nats as natsbus
from healer.controller.core import power_views
from healer.controller.incidents import book
from healer.controller.power import power_budget
from healer.controller.remediation import policy
from healer.controller.store import kv
from healer.ui import board, fleet, live, server
from tests.controller import conftest as ctl_conftest

STATIC = pathlib.Path(server.__file__).parent / "static"
FIRST_SEEN = {"admission": "first-seen"} if "admission" in config.ControllerSettings.model_fields else {}
"""A controller with the log actuator admits nodes only this way once admission exists (issue #12)."""


async def serve_static(**ui: Any) -> server.Running:
    lv = live.Live(fleet.Fleet(2), board.Board())
    return await server.serve(lv, config.UiSettings(port=0, **ui))


async def test_with_a_token_every_route_needs_it_and_the_token_leaves_the_address_bar() -> None:
    running = await serve_static(token="s3cret")
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:  # IP hosts too
            for path in ("/", "/static/app.js", "/api/snapshot", "/api/events", "/healthz"):
                async with http.get(running.url.rstrip("/") + path) as r:
                    assert r.status == 401, path
            async with http.get(running.url + "?token=wrong") as r:
                assert r.status == 401
            async with http.get(
                running.url + "api/snapshot", headers={"Authorization": "Bearer s3cret"}
            ) as r:
                assert r.status == 200
            async with http.get(running.url + "?token=s3cret", allow_redirects=False) as r:
                assert r.status == 303
                assert r.headers["Location"] == "/"
                cookie = r.cookies[server.COOKIE]
                assert cookie["httponly"]
                assert cookie["samesite"] == "Strict"
            async with http.get(running.url) as r:  # the session keeps the cookie
                assert r.status == 200
    finally:
        await running.stop()


async def test_it_refuses_to_listen_beyond_loopback_without_a_token() -> None:
    with pytest.raises(errors.PermanentError, match="without a token"):
        await serve_static(host="0.0.0.0")
    server.check(config.UiSettings(host="::1"))
    server.check(config.UiSettings(host="0.0.0.0", token="t"))
    assert cli.main(["ui", "--host", "0.0.0.0", "--nats", "nats://127.0.0.1:1"]) == 2


async def test_only_get_is_answered_and_every_page_forbids_anything_from_elsewhere() -> None:
    running = await serve_static()
    try:
        async with aiohttp.ClientSession() as http:
            for method in ("POST", "PUT", "DELETE", "PATCH"):
                async with http.request(method, running.url + "api/snapshot") as r:
                    assert r.status == 405, method
            for path in ("", "static/app.js", "static/chart.js", "static/style.css", "static/icon.svg"):
                async with http.get(running.url + path) as r:
                    assert r.status == 200, path
                    assert r.headers["Content-Security-Policy"].startswith("default-src 'none'")
            async with http.get(running.url + "static/other.js") as r:
                assert r.status == 404
    finally:
        await running.stop()


async def test_a_gpu_panel_shows_the_models_components_when_the_page_has_them() -> None:
    """Served by the controller with a model, the page asks it (``AnomalySource``) for a GPU's components;
    without one the panel says the components are not reachable."""
    from tests.controller.conftest import Fleet as FrameMaker

    class Components:
        def components(self, node: str, gpu: int) -> dict[str, float] | None:
            return {"anomaly_score": 0.42, "thermal_rise": 0.8, "forest": 0.3} if gpu == 1 else None

    frame = FrameMaker(None, ["n1"]).frame("n1")  # type: ignore[arg-type]  # only builds frames
    for anomaly in (Components(), None):
        lv = live.Live(fleet.Fleet(2), board.Board())
        lv.fleet.ingest("n1", frame, time.time())
        running = await server.serve(lv, config.UiSettings(port=0), anomaly=anomaly)
        try:
            async with aiohttp.ClientSession() as http:
                shown = {}
                for gpu in (0, 1):
                    async with http.get(f"{running.url}api/gpu", params={"node": "n1", "gpu": str(gpu)}) as r:
                        assert r.status == 200
                        shown[gpu] = (await r.json())["anomaly"]
        finally:
            await running.stop()
        if anomaly is None:
            assert [shown[g]["available"] for g in (0, 1)] == [False, False]
            assert shown[1]["note"] == server.NO_ANOMALY
        else:
            assert shown[1]["available"] is True
            assert shown[1]["components"] == {"anomaly_score": 0.42, "thermal_rise": 0.8, "forest": 0.3}
            assert shown[0]["available"] is False, "a GPU the model has not scored yet"


async def test_the_page_loads_every_script_it_ships_and_each_is_served() -> None:
    """The page's script is split by role into plain files (no bundler): index.html names each one, the
    server answers each, and no file under static/ is left out of the page."""
    names = re.findall(r'<script src="/static/([^"]+)" defer></script>', (STATIC / "index.html").read_text())
    assert names[-1] == "app.js", "the live stream starts once every part is there"
    parts = ("map.js", "panels.js", "node_view.js", "app.js")
    assert all(names.index("page.js") < names.index(p) for p in parts), "the shared part first"
    assert sorted(names) == sorted(p.name for p in STATIC.glob("*.js"))
    running = await serve_static()
    try:
        async with aiohttp.ClientSession() as http:
            for name in names:
                async with http.get(running.url + "static/" + name) as r:
                    assert r.status == 200, name
                    assert r.headers["Content-Type"].startswith("text/javascript"), name
                    assert (await r.read()) == (STATIC / name).read_bytes()
    finally:
        await running.stop()


def test_the_page_references_no_outside_url() -> None:
    for path in STATIC.iterdir():
        text = path.read_text()
        text = text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # a namespace name, never fetched
        text = text.replace('const SVG = "http://www.w3.org/2000/svg";', "")  # the same, for createElementNS
        assert re.findall(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text) == [], path.name


def test_the_agent_command_path_does_not_import_the_page() -> None:
    import subprocess
    import sys

    code = "import sys; from healer import cli; cli.build_parser(); print('healer.ui.server' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


class Stream:
    """Reads server-sent events from the page's stream."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp

    async def next(self, event: str, timeout: float = 5.0) -> Any:
        async with asyncio.timeout(timeout):
            name = None
            while True:
                line = (await self.resp.content.readline()).decode().rstrip("\n")
                if line.startswith("event: "):
                    name = line.removeprefix("event: ")
                elif line.startswith("data: ") and name == event:
                    return orjson.loads(line.removeprefix("data: "))


@pytest.fixture
async def page(
    nats_server: embedded.EmbeddedServer, nats_bus: natsbus.NatsBus
) -> AsyncIterator[dict[str, Any]]:
    store = kv.Store(await nats_bus.key_value(subjects.Subjects().kv_state))
    inc = book.Incident(
        id="inc-old", rule_id="node-silent", severity="major", node="gpu-9", mode="enforce",
        opened_at=time.time() - 7200, updated_at=time.time() - 7200, summary="silent for 2m",
    )  # fmt: skip
    await store.put(book.PREFIX + inc.id, inc.model_dump())
    settings = config.Settings(
        nats=config.NatsSettings(url=nats_server.url),
        ui=config.UiSettings(port=0, push_s=0.2, feed_window_s=60),
    )
    ui_bus = await natsbus.NatsBus.connect(nats_server.url, name="ui")
    running = await server.start(ui_bus, settings)
    try:
        yield {"store": store, "ui": running}
    finally:
        await running.stop()
        await ui_bus.close()


@pytest.mark.nats
async def test_breaker_and_exclusions_are_pushed_from_kv_and_old_incidents_are_seeded(
    page: dict[str, Any], nats_bus: natsbus.NatsBus
) -> None:
    store: kv.Store = page["store"]
    async with aiohttp.ClientSession() as http, http.get(page["ui"].url + "api/events") as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        assert r.headers["Content-Security-Policy"] == server.CSP
        stream = Stream(r)
        snap = await stream.next("snapshot")
        if not snap["incidents"]:  # the KV watch may still be starting: the seed arrives as an event
            assert (await stream.next("incident"))["id"] == "inc-old"
        else:
            assert [i["id"] for i in snap["incidents"]] == ["inc-old"]
        await policy.Exclusions(store).add("gpu-3", by="ops", reason="fan swap")
        safety = await stream.next("safety")
        while not safety["exclusions"]:
            safety = await stream.next("safety")
        assert safety["exclusions"] == [
            {"node": "gpu-3", "by": "ops", "reason": "fan swap", "at": pytest.approx(time.time(), abs=30)}
        ]
        await store.put(
            policy.BREAKER_KEY, {"open": True, "opened_at": 1.0, "reason": "too many", "entries": []}
        )
        safety = await stream.next("safety")
        assert safety["breaker"]["open"]
        assert safety["breaker"]["reason"] == "too many"


@pytest.mark.nats
async def test_a_power_budgets_caps_and_shed_are_pushed_from_kv(page: dict[str, Any]) -> None:
    store: kv.Store = page["store"]
    async with aiohttp.ClientSession() as http, http.get(page["ui"].url + "api/events") as r:
        stream = Stream(r)
        await stream.next("snapshot")
        budget = config.PowerBudget(key="rack", value="r7", contract_kw=40)
        state = power_budget.DomainState(
            capped_w={"gpu-1/0": 500.0, "gpu-1/1": 500.0},
            original_w={"gpu-1/0": 700.0, "gpu-1/1": 700.0},
            cycles=(1.0,),
            shed_to_w=28000.0,
            shed_until=time.time() + 600,
        )
        await store.put(power_views.kv_key(budget), {**state.dump(), "domain": budget.domain})  # as the shell
        safety = await stream.next("safety")
        while not safety["power"]:
            safety = await stream.next("safety")
        assert safety["power"] == [
            {
                "domain": "rack=r7",
                "capped_gpus": 2,
                "shed_to_w": 28000.0,
                "shed_until": pytest.approx(time.time() + 600, abs=30),
                "cycles": 1,
                "draw_w": None,
                "budget_w": None,
                "budget_in_force_w": None,
                "at": None,
                "phase": None,
                "gpus": None,
                "incident_id": None,
            }
        ]  # fmt: skip, a controller before #30's live view writes none of it
        view = power_views.DomainView(
            budget, ("gpu-1", "gpu-2"), 16, 27_100.0, 28_000.0, power_budget.Phase.CAPPED, state, "inc-1"
        )
        doc = {**state.dump(), "domain": budget.domain, "live": power_views.live_of(view, 1_900_000_000.0)}
        await store.put(power_views.kv_key(budget), doc)  # as the leader writes it at a step
        safety = await stream.next("safety")
        while safety["power"][0]["draw_w"] is None:
            safety = await stream.next("safety")
        [row] = safety["power"]
        assert (row["draw_w"], row["budget_w"], row["budget_in_force_w"]) == (27100.0, 40000.0, 28000.0)
        assert (row["phase"], row["gpus"], row["incident_id"], row["at"]) == ("capped", 16, "inc-1", 1.9e9)


@pytest.mark.nats
async def test_the_page_never_writes_to_nats(page: dict[str, Any], nats_bus: natsbus.NatsBus) -> None:
    seen: list[str] = []

    async def spy(msg: Any) -> None:
        seen.append(msg.subject)

    for subject in ("healer.>", "$KV.>"):
        await nats_bus.subscribe(subject, spy)
    before = {
        s: (await nats_bus.js.stream_info(s)).state.messages for s in ("KV_healer-state", "HEALER_INCIDENTS")
    }
    async with aiohttp.ClientSession() as http:
        async with http.get(page["ui"].url + "api/events") as r:
            await Stream(r).next("snapshot")
        async with http.get(page["ui"].url + "api/snapshot") as r:
            assert r.status == 200
        await asyncio.sleep(1.0)
    await nats_bus.flush()
    assert seen == []
    after = {s: (await nats_bus.js.stream_info(s)).state.messages for s in before}
    assert after == before


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.nats
async def test_the_controller_serves_the_page_when_ui_is_enabled(
    nats_server: embedded.EmbeddedServer, tmp_path: pathlib.Path
) -> None:
    from healer.cli import controller_cmd
    from healer.controller.observability import metrics

    port = _free_port()
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "dbe.yaml").write_text(ctl_conftest.DBE_RULES)
    s = config.Settings(
        nats=config.NatsSettings(url=nats_server.url),
        controller=config.ControllerSettings.model_validate(
            {"rules_dir": str(tmp_path / "rules"), "metrics_port": 0, **FIRST_SEEN}
        ),
        ui=config.UiSettings(enabled=True, port=port),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(controller_cmd.run_controller(s, stop, metrics.ControllerMetrics()))
    try:
        async with aiohttp.ClientSession() as http:
            async with asyncio.timeout(15):
                while True:
                    try:
                        async with http.get(f"http://127.0.0.1:{port}/api/snapshot") as r:
                            assert r.status == 200
                            assert (await r.json())["title"] == "healer · default"
                            break
                    except aiohttp.ClientConnectionError:
                        if task.done():
                            task.result()
                        await asyncio.sleep(0.1)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    assert await asyncio.to_thread(_refused, port)


def _refused(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


async def test_the_gpu_panel_shows_its_nodes_rdma_ports(tmp_path: pathlib.Path) -> None:
    """The ports of the node's newest frame (as the agent read them from sysfs) come with a GPU's view;
    a node whose frames carry none says so with null, one without RDMA with []."""
    from healer.schemas import codec, telemetry
    from healer.telemetry import rdma

    def read_ports() -> list[Any]:
        fixtures = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"
        root = rdma.write_tree((fixtures / "cx7-ib-link-down.txt").read_text(), tmp_path / "sys")
        return rdma.PortReader(root).read()

    ports = await asyncio.to_thread(read_ports)
    common = {"ts": 1.0, "seq": 0, "boot_id": "b", "agent_version": "t", "source": "sim"}
    gpu0 = [telemetry.GpuSample(index=0, temp_c=40.0)]
    frames = {
        "ib": telemetry.NodeFrame(node="ib", **common, gpus=gpu0, ports=ports,
                                  schema=telemetry.SCHEMA_V2),
        "none": telemetry.NodeFrame(node="none", **common, gpus=gpu0, ports=[], schema=telemetry.SCHEMA_V2),
        "old": telemetry.NodeFrame(node="old", **common, gpus=gpu0),
    }  # fmt: skip
    lv = live.Live(fleet.Fleet(1), board.Board())
    for name, f in frames.items():
        lv.fleet.ingest(name, codec.decode_frame_view(codec.encode(f)), time.time())
    running = await server.serve(lv, config.UiSettings(port=0))
    try:
        async with aiohttp.ClientSession() as http:
            shown = {}
            for name in frames:
                async with http.get(f"{running.url}api/gpu", params={"node": name, "gpu": "0"}) as r:
                    assert r.status == 200
                    shown[name] = (await r.json())["ports"]
    finally:
        await running.stop()
    assert len(shown["ib"]) == 8
    down = next(p for p in shown["ib"] if p["device"] == "mlx5_3")
    assert (down["state"], down["phys_state"], down["rate_gbps"]) == (1, 2, 10.0)
    assert (shown["none"], shown["old"]) == ([], None)


def test_the_map_groups_by_the_inventorys_failure_domains_and_the_labels_file_wins(
    tmp_path: pathlib.Path,
) -> None:
    """#27: with admission ``file`` the inventory's domains are the page's labels before any incident."""
    (tmp_path / "inventory.yaml").write_text(
        "nodes: {gpu01: {rack: r1, pdu: p1}, gpu02: {rack: r1}, gpu03: {rack: r2}, gpu04: {}}\n"
    )
    (tmp_path / "labels.yaml").write_text("gpu02: {rack: r9}\n")
    s = config.Settings.model_validate(
        {
            "controller": {"admission": "file", "inventory_file": str(tmp_path / "inventory.yaml")},
            "ui": {"labels_file": str(tmp_path / "labels.yaml"), "group_by": ["pdu", "rack"]},
        }
    )
    labels = server.page_labels(s)
    assert labels["gpu01"] == {"rack": "r1", "pdu": "p1"}
    assert labels["gpu02"] == {"rack": "r9"}
    assert labels.get("gpu04", {}) == {}
    lv = live.Live(fleet.Fleet(1, ring_len=2, capacity=4), board.Board(), group_by=("pdu", "rack"))
    lv.extra_labels = labels
    for name in ("gpu01", "gpu02", "gpu03", "gpu04"):
        lv.fleet.declare([name])
    groups = dict(lv.groups())
    assert {k: [lv.fleet.names[r] for r in v] for k, v in groups.items()} == {
        "pdu=p1": ["gpu01"],
        "rack=r2": ["gpu03"],
        "rack=r9": ["gpu02"],
        "unlabelled": ["gpu04"],
    }
    other = config.Settings.model_validate({"controller": {"admission": "first-seen"}})
    assert server.page_labels(other) == {}


def test_the_page_groups_by_the_controllers_own_topology_and_the_switch_tree(tmp_path: pathlib.Path) -> None:
    """#27: the page's domains come from the source the admitted fleet comes from: inside the
    controller its ``Admission.topology()`` (scheduler labels and Slurm features too), asked again as it
    changes; standalone, ``controller.topology_file`` beside the inventory. The labels file still wins."""
    import types

    import structlog

    from healer.cli import controller_cmd
    from healer.controller.inventory import admission
    from healer.controller.observability import metrics

    topo = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "topology.conf"
    (tmp_path / "labels.yaml").write_text("gpu02: {rack: r9}\n")
    s = config.Settings.model_validate(
        {
            "controller": {
                "admission": "scheduler",
                "topology_file": str(topo),
                "domain_features": {"pdu": "pdu_"},
            },
            "ui": {"labels_file": str(tmp_path / "labels.yaml"), "group_by": ["rack", "switch"]},
        }
    )
    standalone = server.page_labels(s)
    assert standalone["gpu01"]["switch"] == "leaf-01", "topology.conf reaches the standalone page"
    assert standalone["gpu02"] == {**standalone["gpu02"], "rack": "r9"}

    class Slurmish:
        async def node_labels(self, nodes: list[str]) -> dict[str, dict[str, str]]:
            known = {"gpu01": "h100,rack=r01,pdu_p1", "gpu02": "h100,rack=r01,pdu_p1", "gpu05": "rack=r02"}
            return {n: {"features": known[n]} for n in nodes if n in known}

    adm = admission.Admission(
        s.controller, metrics.ControllerMetrics(), scheduler=Slurmish(), log=structlog.get_logger()
    )
    source = controller_cmd._domains(types.SimpleNamespace(admission=adm))
    assert source is not None
    lv = live.Live(fleet.Fleet(1, ring_len=2, capacity=8), board.Board(), group_by=("rack", "switch"))
    lv.static_labels = standalone
    lv.label_source = source
    lv.fleet.declare(["gpu01", "gpu02", "gpu05"])

    def shown(now: float) -> dict[str, list[str]]:
        lv.sync_nodes(now)
        return {k: [lv.fleet.names[r] for r in v] for k, v in lv.groups()}

    assert shown(100.0) == {"switch=leaf-01": ["gpu01"], "rack=r9": ["gpu02"], "switch=leaf-02": ["gpu05"]}
    for name in ("gpu01", "gpu02", "gpu05"):
        adm.admits(name)
    asyncio.run(adm.refresh())  # the scheduler admits them: their features are domains now
    assert shown(100.0 + live.ADMITTED_EVERY_S) == {
        "rack=r01": ["gpu01"], "rack=r02": ["gpu05"], "rack=r9": ["gpu02"],
    }  # fmt: skip
    assert adm.topology().of("gpu01") == {
        "rack": "r01", "pdu": "p1", "switch": "leaf-01", "switch_l2": "spine-1", "switch_l3": "core",
    }  # fmt: skip
