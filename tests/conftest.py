"""Shared fixtures: real nats-servers (single and a 3-node cluster) on free loopback ports.

Each fixture starts its own server from the venv's nats-server binary, in a temporary state directory,
and stops it (by its own PID) afterwards, whatever the test did.
"""

from __future__ import annotations

import asyncio
import inspect
import pathlib
from collections.abc import AsyncIterator, Callable, Iterator

import prometheus_client as prom
import pytest
import structlog
from hypothesis import HealthCheck, settings

from healer import config
from healer.bus import base, embedded, memory, provision, subjects
from healer.bus import nats as natsbus
from healer.schemas import framecols

# Property tests check behaviour, not speed: no per-example deadline and no "too slow" health check, so
# a loaded machine (CI, the suite beside a benchmark) cannot fail them. Speed is the benchmarks' job.
settings.register_profile("healer", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("healer")

MARKED_BY_FIXTURE: dict[str, str] = {
    "nats_server": "nats",
    "nats_cluster": "nats",
    "nats_bus": "nats",
    "slurm_cluster": "slurm",
    "browser": "browser",
}
"""Fixtures that start a real server or process, and the marker a test using one (at any depth) gets."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that starts a server or process through a fixture, so ``-m "not nats"`` and
    the like select honestly (the ``bus`` fixture's ``nats`` case counts too)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("bus") == "nats":
            names.add("nats_server")
        for marker in sorted({MARKED_BY_FIXTURE[n] for n in names & MARKED_BY_FIXTURE.keys()}):
            if item.get_closest_marker(marker) is None:
                item.add_marker(marker)


LEAK_GRACE_S = 5.0
"""How long the tasks a test started may take to finish after it (and its fixtures) ended."""


@pytest.fixture
async def _no_task_leaks() -> AsyncIterator[None]:
    """No asyncio task may leak from a test (../STYLE): whatever the test and its fixtures started must
    be done once they are torn down (this fixture is set up first, so it is torn down last). A leaked
    task fails the test by name; it is cancelled so the next test starts clean."""
    before = asyncio.all_tasks()
    yield
    me = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() - before if t is not me and not t.done()]
    if not left:
        return
    _, pending = await asyncio.wait(left, timeout=LEAK_GRACE_S)
    if pending:
        names = sorted(f"{t.get_name()} ({getattr(t.get_coro(), '__qualname__', '?')})" for t in pending)
        for t in pending:
            t.cancel()
        await asyncio.wait(pending, timeout=LEAK_GRACE_S)
        pytest.fail(f"the test left {len(names)} asyncio task(s) running: {names}")


@pytest.fixture(autouse=True)
def _async_tests_leak_no_task(request: pytest.FixtureRequest) -> None:
    """Every async test is checked by ``_no_task_leaks`` (requested first, so torn down last)."""
    if inspect.iscoroutinefunction(request.function):
        request.getfixturevalue("_no_task_leaks")


@pytest.fixture(autouse=True)
def _structlog_config_restored() -> Iterator[None]:
    """A command run in-process (``cli.main``) configures logging as the real one does (e.g. errors only);
    the next test's ``capture_logs`` must not inherit that level filter."""
    saved = structlog.get_config()
    try:
        yield
    finally:
        structlog.configure(**saved)


@pytest.fixture(params=["compiled", "python"])
def frame_decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with each columnar frame decoder (healer/schemas/framecols.py): the compiled one, and
    the pure-Python one that runs where it was not built. Strictness and rejection counts are the
    decoders' to keep equal; the tests that check them run on both."""
    if request.param == "python":
        monkeypatch.setattr(framecols, "_COMPILED", None)
    elif not framecols.ACCELERATED:
        pytest.skip("the compiled frame decoder was not built (no C compiler at install)")
    return str(request.param)


@pytest.fixture
def nats_server(tmp_path: pathlib.Path) -> Iterator[embedded.EmbeddedServer]:
    srv = embedded.EmbeddedServer(tmp_path / "nats")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def nats_cluster(tmp_path: pathlib.Path) -> Iterator[embedded.EmbeddedCluster]:
    cluster = embedded.EmbeddedCluster(tmp_path / "cluster", size=3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def procs() -> AsyncIterator[list[asyncio.subprocess.Process]]:
    """Processes a test started; whatever is still running at the end is killed (by its own PID)."""
    started: list[asyncio.subprocess.Process] = []
    try:
        yield started
    finally:
        for p in started:
            if p.returncode is None:
                p.kill()
                await p.wait()


@pytest.fixture
def subj() -> subjects.Subjects:
    return subjects.Subjects()


@pytest.fixture
async def nats_bus(
    nats_server: embedded.EmbeddedServer, subj: subjects.Subjects
) -> AsyncIterator[natsbus.NatsBus]:
    """A connected, provisioned NatsBus on a fresh server."""
    bus = await natsbus.NatsBus.connect(nats_server.url, name="test")
    await provision.ensure(bus, subj, config.NatsSettings())
    try:
        yield bus
    finally:
        await bus.close()


@pytest.fixture(params=["memory", "nats"])
async def bus(request: pytest.FixtureRequest, subj: subjects.Subjects) -> AsyncIterator[base.Bus]:
    """The same test body runs on the in-memory bus and on a real, provisioned nats-server."""
    if request.param == "memory":
        mem = make_memory_bus(subj)
        yield mem
        await mem.close()
    else:
        srv: embedded.EmbeddedServer = request.getfixturevalue("nats_server")
        real = await natsbus.NatsBus.connect(srv.url, name="test")
        await provision.ensure(real, subj, config.NatsSettings())
        yield real
        await real.close()


class Collector:
    """A subscription handler that keeps every message and can wait for a count."""

    def __init__(self) -> None:
        self.msgs: list[base.Msg] = []
        self.changed = asyncio.Event()

    async def __call__(self, msg: base.Msg) -> None:
        self.msgs.append(msg)
        self.changed.set()

    async def wait_for(self, n: int, timeout: float = 10.0) -> list[base.Msg]:
        async with asyncio.timeout(timeout):
            while len(self.msgs) < n:
                self.changed.clear()
                await self.changed.wait()
        return self.msgs


def make_memory_bus(subj: subjects.Subjects) -> memory.MemoryBus:
    """A MemoryBus with the same streams and key-value buckets as a provisioned server."""
    bus = memory.MemoryBus()
    bus.add_stream(subj.stream_telemetry, [subj.all_telemetry])
    bus.add_stream(subj.stream_events, [subj.all_events])
    bus.add_stream(subj.stream_incidents, [subj.all_incidents])
    bus.add_bucket(subj.kv_state)
    bus.add_bucket(subj.kv_leases)
    return bus


@pytest.fixture
async def memory_bus(subj: subjects.Subjects) -> AsyncIterator[memory.MemoryBus]:
    bus = make_memory_bus(subj)
    try:
        yield bus
    finally:
        await bus.close()


async def until(predicate: Callable[[], bool], timeout: float = 10.0, step: float = 0.05) -> None:
    """Poll ``predicate`` until it holds; TimeoutError after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - polling other objects' state is the point
            await asyncio.sleep(step)


async def read_stream(bus: natsbus.NatsBus, subject: str, quiet_s: float = 1.0) -> list[bytes]:
    """Every message a stream holds on ``subject``, read by an ordered consumer until it goes quiet."""
    sub = await bus.js.subscribe(subject, ordered_consumer=True)
    out: list[bytes] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=quiet_s)
            except TimeoutError:
                return out
            out.append(msg.data)
    finally:
        await sub.unsubscribe()


def sample(registry: prom.CollectorRegistry, name: str, **labels: str) -> float:
    """One series' value as a scrape would read it (``get_sample_value``, no client internals); 0 for a
    labelled series that has not been touched yet."""
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value
