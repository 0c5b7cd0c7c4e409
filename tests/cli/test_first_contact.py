"""First contact, as a new user meets it (issue #13): every command fails fast with one line naming the
setting to fix and a documented exit code, long-running commands stop on SIGTERM/SIGINT whatever they
wait on, health endpoints tell the truth, and admin commands leave stream settings alone.

Commands run as real processes (``python -m healer``) against real nats-servers or dead ports."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from healer import config
from healer.bus import embedded, provision, subjects
from healer.bus import nats as natsbus

HEALER = [sys.executable, "-m", "healer"]
ENV = {**os.environ, "HEALER_LOG_FORMAT": "json", "HEALER_CONTROLLER_ADMISSION": "first-seen"}
"""The controllers here run the log actuator, which lists no nodes: they admit what reports."""
ENV.pop("HEALER_CONFIG", None)
ENV.pop("HEALER_NATS_URL", None)
DAY_S = 86400.0
EXIT_FAILED = 1
"""Documented exit code: NATS unreachable, credentials or TLS refused, the command could not do its work."""
EXIT_USAGE = 2
"""Documented exit code: a setting or flag to fix (malformed URL, busy port, unwritable path ...)."""


def dead_url() -> str:
    """A loopback port nothing listens on."""
    return f"nats://127.0.0.1:{embedded.free_port()}"


def run(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A healer command to its end. The limit only catches a hang: on a loaded machine one took over 30 s
    (the model's imports), and what is tested is the outcome, not the time."""
    return subprocess.run(
        [*HEALER, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env or ENV,
        stdin=subprocess.DEVNULL,
    )


def last_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines, f"nothing on stderr (rc={done.returncode}, stdout={done.stdout!r})"
    return lines[-1]


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the process exited before serving HTTP"
        with contextlib.suppress(OSError):
            http_get(url)
            return
        time.sleep(0.2)
    raise AssertionError(f"{url} never answered")


@contextlib.contextmanager
def busy_port() -> Iterator[int]:
    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))
    sock.listen()
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def stop_and_wait(proc: subprocess.Popen[bytes], sig: signal.Signals, within_s: float = 15.0) -> str:
    proc.send_signal(sig)
    try:
        out, _ = proc.communicate(timeout=within_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise AssertionError(f"{sig.name} did not stop the process within {within_s} s") from None
    return out.decode()


def handles(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` has installed a handler for ``sig`` (Linux: ``SigCgt`` in
    ``/proc/<pid>/status``). The CLI installs its SIGTERM/SIGINT handlers together as its event loop
    starts, so this is the moment a signal stops it cleanly; before it, Python's start-up and imports
    (seconds on a loaded machine) leave SIGTERM at its default."""
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (sig - 1)))


class Watched:
    """A started CLI process whose merged output is read as it comes (a thread), so a test waits for its
    handlers or a line instead of sleeping a guess."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for raw in self.proc.stdout:
                self.lines.append(raw.decode(errors="replace"))

    def output(self) -> str:
        return "".join(self.lines)

    def wait(self, what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode} before {what}: {self.output()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout} s: {self.output()[-2000:]}")
            time.sleep(0.1)

    def wait_handling(self) -> None:
        """Until the CLI's own handlers are in: SIGTERM's shows it (SIGINT has Python's from the start,
        which raises KeyboardInterrupt wherever start-up is; the CLI installs the two together)."""
        self.wait("SIGTERM handler", lambda: handles(self.proc.pid, signal.SIGTERM))

    def wait_line(self, text: str) -> None:
        self.wait(repr(text), lambda: text in self.output())

    def stop(self, sig: signal.Signals, within_s: float = 15.0) -> str:
        """Send ``sig``; the output once the process has ended (killed, and an AssertionError, when it
        does not end within ``within_s``)."""
        self.proc.send_signal(sig)
        try:
            self.proc.wait(within_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{sig.name} did not stop the process within {within_s} s") from None
        finally:
            self._reader.join(10)  # the pipe closes as the process ends: the reader ends with it
        return self.output()


# -- 1. fail fast on first contact ------------------------------------------------------------------

ONE_SHOT = [
    ["sim", "--nodes", "1"],
    ["incidents", "tail"],
    ["incidents", "tail", "--follow"],
    ["telemetry", "watch"],
    ["breaker", "status"],
    ["exclude", "list"],
    ["nats", "provision"],
    ["power", "status"],
    ["power", "shed", "--domain", "rack=r7", "--to", "40"],
]


@pytest.mark.parametrize("command", ONE_SHOT, ids=" ".join)
def test_a_dead_nats_url_is_one_line_and_exit_1(command: list[str]) -> None:
    url = dead_url()
    done = run(*command, "--nats", url)
    assert done.returncode == EXIT_FAILED
    line = last_line(done)
    assert url in line
    assert "nats.url" in line


def test_model_train_from_a_dead_stream_is_one_line_and_exit_1(tmp_path: pathlib.Path) -> None:
    url = dead_url()
    done = run("model", "train", "--from-stream", url, "--out", str(tmp_path / "m"))
    assert done.returncode == EXIT_FAILED
    assert url in last_line(done)


@pytest.mark.parametrize("command", [*ONE_SHOT, ["controller"], ["agent", "--source", "sim"]], ids=" ".join)
@pytest.mark.parametrize("url", ["http://127.0.0.1:4222", "nats://127.0.0.1:42x2"])
def test_a_malformed_nats_url_is_a_settings_error(
    command: list[str], url: str, tmp_path: pathlib.Path
) -> None:
    done = run(*command, "--nats", url, env={**ENV, "HEALER_AGENT_STATE_DIR": str(tmp_path)})
    assert done.returncode == EXIT_USAGE
    line = last_line(done)
    assert "nats.url" in line
    assert url in line


def test_refused_credentials_name_the_credential_settings(tmp_path: pathlib.Path) -> None:
    srv = embedded.EmbeddedServer(tmp_path / "nats", extra_config='authorization { token: "s3cret" }')
    srv.start()
    try:
        done = run("breaker", "status", "--nats", srv.url)
    finally:
        srv.stop()
    assert done.returncode == EXIT_FAILED
    line = last_line(done)
    assert "nats.creds_file" in line
    assert srv.url in line


@pytest.mark.parametrize(
    ("command", "setting"),
    [
        (["controller", "--nats", "nats://127.0.0.1:1"], "controller.metrics_port"),
        (["agent", "--source", "sim", "--nats", "nats://127.0.0.1:1"], "agent.metrics_port"),
        (["forward", "--url", "http://127.0.0.1:1/", "--nats", "nats://127.0.0.1:1"], "feed.metrics_port"),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else v,
)
def test_a_busy_metrics_port_is_a_settings_error(
    command: list[str], setting: str, tmp_path: pathlib.Path
) -> None:
    with busy_port() as port:
        done = run(
            *command, "--metrics-port", str(port), env={**ENV, "HEALER_AGENT_STATE_DIR": str(tmp_path)}
        )
    assert done.returncode == EXIT_USAGE
    line = last_line(done)
    assert setting in line
    assert str(port) in line
    assert "in use" in line


def test_schema_export_to_an_unwritable_path_is_a_settings_error(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = run("schema", "export", "--out", str(blocker / "schemas"))
    assert done.returncode == EXIT_USAGE
    assert str(blocker / "schemas") in last_line(done)


def test_agent_with_an_unwritable_state_dir_is_a_settings_error(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = run("agent", "--source", "sim", "--metrics-port", "0", "--state-dir", str(blocker / "state"))
    assert done.returncode == EXIT_USAGE
    assert "agent.state_dir" in last_line(done)


def test_a_shard_outside_the_shards_is_refused() -> None:
    done = run("controller", "--shards", "2", "--shard", "5", "--nats", dead_url(), "--metrics-port", "0")
    assert done.returncode == EXIT_USAGE
    line = last_line(done)
    assert "shard 5" in line
    assert "shards=2" in line


# -- 2. SIGTERM and SIGINT stop long-running commands, whatever they wait on ------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_controller_stops_on_signal_while_nats_is_unreachable_and_is_alive_but_not_ready(
    sig: signal.Signals,
) -> None:
    port = embedded.free_port()
    proc = subprocess.Popen(
        [*HEALER, "controller", "--nats", dead_url(), "--metrics-port", str(port)],
        env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", proc)
        time.sleep(1.5)  # inside tenacity's retry loop by now
        status, body = http_get(f"{base}/healthz")
        assert status == 200
        assert json.loads(body)["alive"] is True
        status, body = http_get(f"{base}/readyz")
        ready = json.loads(body)
        assert status == 503
        assert ready["ready"] is False
        assert ready["checks"]["nats"]["ok"] is False
        assert http_get(f"{base}/")[0] == 404
        status, body = http_get(f"{base}/metrics")
        assert status == 200
        assert "healer_controller_frames_ingested_total" in body
    finally:
        out = stop_and_wait(proc, sig)
    assert proc.returncode == 0, out[-2000:]
    assert "nats.connect_retry" in out, "each attempt is logged"


def test_forward_stops_on_sigterm_while_nats_is_unreachable() -> None:
    forward = Watched([*HEALER, "forward", "--url", "http://127.0.0.1:1/", "--nats", dead_url()])
    forward.wait_handling()
    forward.wait_line("nats.connect_retry")  # inside the retry loop
    out = forward.stop(signal.SIGTERM)
    assert forward.proc.returncode == 0, out[-2000:]
    assert "nats.connect_retry" in out
    assert "Traceback" not in out


def test_nats_serve_on_a_busy_port_is_a_settings_error(tmp_path: pathlib.Path) -> None:
    with busy_port() as port:
        done = run("nats", "serve", "--port", str(port), "--store-dir", str(tmp_path / "nats"))
    assert done.returncode == EXIT_USAGE
    line = last_line(done)
    assert "--port" in line
    assert "in use" in line


# -- 3. one way to load settings; admin commands never change streams -------------------------------


def test_flag_beats_environment_beats_file(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "healer.yaml"
    path.write_text("nats:\n  url: nats://from-file:4222\n  prefix: filed\n")
    monkeypatch.delenv("HEALER_CONFIG", raising=False)
    monkeypatch.delenv("HEALER_NATS_PREFIX", raising=False)
    monkeypatch.setenv("HEALER_NATS_URL", "nats://from-env:4222")
    parser = __import__("argparse").ArgumentParser()
    from healer.cli import common  # here: the module also runs against old code, for the other tests

    common.add_nats_option(parser)
    s = common.settings(parser.parse_args(["--config", str(path)]))
    assert (s.nats.url, s.nats.prefix) == ("nats://from-env:4222", "filed")
    s = common.settings(parser.parse_args(["--config", str(path), "--nats", "nats://from-flag:4222"]))
    assert s.nats.url == "nats://from-flag:4222"
    monkeypatch.delenv("HEALER_NATS_URL")
    assert common.settings(parser.parse_args(["--config", str(path)])).nats.url == "nats://from-file:4222"


async def _set_events_max_age(url: str, max_age_s: float) -> None:
    bus = await natsbus.NatsBus.connect(url, name="operator")
    try:
        subj = subjects.Subjects()
        cfg = (await bus.js.stream_info(subj.stream_events)).config
        cfg.max_age = max_age_s
        await bus.js.update_stream(cfg)
    finally:
        await bus.close()


async def _events_max_age(url: str) -> float:
    bus = await natsbus.NatsBus.connect(url, name="operator")
    try:
        return float((await bus.js.stream_info(subjects.Subjects().stream_events)).config.max_age or 0)
    finally:
        await bus.close()


async def _stream_names(url: str) -> list[str]:
    bus = await natsbus.NatsBus.connect(url, name="operator")
    try:
        return sorted([s.config.name or "" for s in await bus.js.streams_info()])
    finally:
        await bus.close()


def test_admin_commands_read_the_config_file_and_keep_an_operators_retention(
    nats_server: embedded.EmbeddedServer, tmp_path: pathlib.Path
) -> None:
    assert run("nats", "provision", "--nats", nats_server.url).returncode == 0
    asyncio.run(_set_events_max_age(nats_server.url, 30 * DAY_S))
    path = tmp_path / "healer.yaml"
    path.write_text(f"nats:\n  url: {nats_server.url}\n")
    for command in (["breaker", "status"], ["exclude", "list"], ["breaker", "reset"]):
        done = run(*command, "--config", str(path))  # no --nats: the file's URL
        assert done.returncode == 0, done.stderr
    assert asyncio.run(_events_max_age(nats_server.url)) == 30 * DAY_S
    assert run("nats", "provision", "--config", str(path)).returncode == 0
    assert asyncio.run(_events_max_age(nats_server.url)) == 30 * DAY_S, "provisioning never lowers retention"


def test_admin_commands_never_provision(nats_server: embedded.EmbeddedServer) -> None:
    done = run("breaker", "status", "--nats", nats_server.url)
    assert done.returncode == EXIT_FAILED
    assert "healer nats provision" in last_line(done)
    assert asyncio.run(_stream_names(nats_server.url)) == []


async def test_provisioning_raises_but_never_lowers_retention(nats_bus: natsbus.NatsBus) -> None:
    subj = subjects.Subjects()
    await provision.ensure(nats_bus, subj, config.NatsSettings(events_max_age_s=30 * DAY_S))
    await provision.ensure(nats_bus, subj, config.NatsSettings(events_max_age_s=7 * DAY_S))
    info = await nats_bus.js.stream_info(subj.stream_events)
    assert info.config.max_age == 30 * DAY_S
    await provision.ensure(nats_bus, subj, config.NatsSettings(events_max_age_s=60 * DAY_S))
    info = await nats_bus.js.stream_info(subj.stream_events)
    assert info.config.max_age == 60 * DAY_S


def test_agent_without_nats_is_alive_not_ready_tells_systemd_and_stops_on_sigterm_keeping_its_events(
    tmp_path: pathlib.Path,
) -> None:
    from healer.agent import spool

    port = embedded.free_port()
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(20)
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [*HEALER, "agent", "--source", "sim", "--node", "n1", "--interval", "0.2", "--nats", dead_url(),
         "--metrics-port", str(port), "--state-dir", str(state)],
        env={**ENV, "NOTIFY_SOCKET": str(tmp_path / "notify.sock")},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        first = notify.recv(4096).decode()
        assert first.startswith("READY=1\nSTATUS=not ready: nats: connecting")
        assert notify.recv(4096) == b"WATCHDOG=1"
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", proc)
        assert http_get(f"{base}/healthz")[0] == 200
        status, body = http_get(f"{base}/readyz")
        assert status == 503
        assert json.loads(body)["checks"]["nats"]["ok"] is False
    finally:
        notify.close()
        out = stop_and_wait(proc, signal.SIGTERM)
    assert proc.returncode == 0, out[-2000:]
    assert len(spool.EventSpool(state)) == 2, "agent_start and agent_stop wait in the spool for NATS"
    spooled = (state / "events.spool").read_text()
    assert '"agent_start"' in spooled
    assert '"agent_stop"' in spooled


def test_the_config_files_credentials_and_tls_reach_admin_and_read_commands(tmp_path: pathlib.Path) -> None:
    """A secured cluster (TLS from a private CA, NKey identities): with the controller's settings file the
    admin and read commands work; without it, or with the wrong CA, one line names the setting."""
    import yaml

    from healer.security import natsconf
    from tests.security import certs

    tls = certs.make(tmp_path / "tls")
    other = certs.make(tmp_path / "other")
    result = natsconf.generate(
        natsconf.Inventory(nodes=["gpu-1"]),
        tmp_path / "auth",
        tls=natsconf.Tls(str(tls.cert), str(tls.key), str(tls.ca)),
    )
    srv = embedded.EmbeddedServer(tmp_path / "nats", extra_config=result.auth_conf.read_text())
    srv.start()
    try:
        identity = yaml.safe_load(result.settings_files[("controller", "controller")].read_text())
        good, wrong_ca = tmp_path / "controller.yaml", tmp_path / "wrong-ca.yaml"
        identity["nats"].update(url=srv.url, tls_ca_file=str(tls.ca))
        good.write_text(yaml.safe_dump(identity))
        identity["nats"]["tls_ca_file"] = str(other.ca)
        wrong_ca.write_text(yaml.safe_dump(identity))

        done = run("nats", "provision", "--config", str(good))
        assert done.returncode == 0, done.stderr
        for command in (["breaker", "status"], ["exclude", "list"], ["incidents", "tail"]):
            done = run(*command, "--config", str(good))
            assert done.returncode == 0, (command, done.stderr)
        done = run("breaker", "status", "--config", str(wrong_ca))
        assert done.returncode == EXIT_FAILED
        assert "nats.tls_ca_file" in last_line(done)
    finally:
        srv.stop()


def test_controller_with_rules_that_do_not_load_says_so_before_trying_nats(tmp_path: pathlib.Path) -> None:
    done = run("controller", "--rules", str(tmp_path / "absent"), "--nats", dead_url(), "--metrics-port", "0")
    assert done.returncode == EXIT_USAGE
    assert "Traceback" not in done.stderr
    assert "controller.rules_dir" in done.stderr
    assert "absent" in last_line(done)


@pytest.mark.parametrize(
    "command",
    [
        ["telemetry", "watch"],
        ["incidents", "tail", "--follow"],
        ["sim", "--nodes", "2", "--interval", "0.2"],
        ["controller", "--metrics-port", "0"],
        ["forward", "--url", "http://127.0.0.1:1/"],
    ],
    ids=" ".join,
)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_long_running_commands_stop_on_a_signal_with_exit_0(
    command: list[str], sig: signal.Signals, nats_server: embedded.EmbeddedServer
) -> None:
    assert run("nats", "provision", "--nats", nats_server.url).returncode == 0
    cli = Watched([*HEALER, *command, "--nats", nats_server.url])
    cli.wait_handling()
    time.sleep(1.0)  # at work by now (a command that ended by itself fails the next line)
    assert cli.proc.poll() is None, "still running before the signal"
    out = cli.stop(sig)
    assert cli.proc.returncode == 0, out[-2000:]
    assert "Traceback" not in out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_nats_serve_stops_on_a_signal(sig: signal.Signals, tmp_path: pathlib.Path) -> None:
    serve = Watched(
        [*HEALER, "nats", "serve", "--port", "0", "--store-dir", str(tmp_path / "nats"), "--provision"]
    )
    serve.wait_handling()  # installed once the streams are provisioned
    out = serve.stop(sig)
    assert "provisioned" in out
    assert serve.proc.returncode == 0, out[-2000:]


def test_replay_to_a_dead_url_is_one_line_and_exit_1(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "r.npz"
    recorded = run(
        "sim", "record", "--nodes", "1", "--sim-hours", "0.01", "--interval", "5", "--out", str(out)
    )
    assert recorded.returncode == 0, recorded.stderr
    url = dead_url()
    done = run("replay", str(out), "--nats", url)
    assert done.returncode == EXIT_FAILED
    line = last_line(done)
    assert url in line
    assert "nats.url" in line


def test_a_path_that_cannot_be_written_is_one_line_and_exit_2(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = run("sim", "record", "--nodes", "1", "--sim-hours", "0.01", "--out", str(blocker / "r.npz"))
    assert done.returncode == EXIT_USAGE
    assert last_line(done) == f"healer sim record: Not a directory: {blocker / 'r.npz'}"


def test_an_agent_that_gave_up_on_nats_says_why_on_readyz(tmp_path: pathlib.Path) -> None:
    port = embedded.free_port()
    url = dead_url()
    proc = subprocess.Popen(
        [*HEALER, "agent", "--source", "sim", "--node", "n1", "--nats", url, "--metrics-port", str(port),
         "--state-dir", str(tmp_path / "state")],
        env={**ENV, "HEALER_RETRY_ATTEMPTS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", proc)
        deadline = time.monotonic() + 20
        while True:
            status, body = http_get(f"http://127.0.0.1:{port}/readyz")
            # before the agent's own checks are in place, readiness has only the loop's
            nats = json.loads(body)["checks"].get("nats", {"detail": ""})
            if nats["detail"].startswith("gave up") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert status == 503
        assert nats["detail"].startswith("gave up")
        assert url in nats["detail"]
    finally:
        out = stop_and_wait(proc, signal.SIGTERM)
    assert proc.returncode == 0, out[-2000:]
