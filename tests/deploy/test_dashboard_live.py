"""Every panel of the Grafana dashboard has data on a healthy system, checked by a real Prometheus.

A real nats-server, a controller, two simulated agents and a feed forwarder (with a local webhook
receiver) run as `healer` processes; Debian's Prometheus (installed by .ci/run) scrapes their /metrics
every second with a ``cluster`` target label, and every panel expression (and every annotation
query) from deploy/grafana/healer.json goes to its query API with the dashboard's variables filled in.
A panel whose query comes back empty would show "No data" in Grafana. Without Prometheus the test skips,
except where ``CI`` is set: there it fails.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from healer.bus import embedded
from healer.telemetry import rdma
from tests.deploy import manifests as m

pytestmark = [pytest.mark.nats, pytest.mark.slow, pytest.mark.prometheus]
ROOT = pathlib.Path(__file__).resolve().parents[2]
HEALER = [sys.executable, "-m", "healer"]


def _prometheus() -> str:
    found = shutil.which("prometheus")
    if found is None:
        message = "Prometheus is not installed; .ci/run installs Debian's package"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


class _Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _processes(tmp: pathlib.Path) -> Iterator[dict[str, int]]:
    """The healer processes, and the metrics port of each, by job name."""
    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    procs: list[subprocess.Popen[bytes]] = []
    logs = contextlib.ExitStack()
    ports = {name: embedded.free_port() for name in ("controller", "agent-a", "agent-b", "forwarder")}
    try:
        with embedded.EmbeddedServer(tmp / "nats") as nats:
            url = nats.url
            config = tmp / "healer.yaml"
            # The power row: both nodes in rack r1 with a budget above their draw, energy counted, and
            # agent-a's GPU 0 running job-7 (its job-mapping directory, as a Slurm prolog writes it).
            (tmp / "nodes.yaml").write_text("nodes:\n  gpu-a: {rack: r1}\n  gpu-b: {rack: r1}\n")
            (tmp / "jobs").mkdir()
            (tmp / "jobs" / "0").write_text("job-7\n")
            config.write_text(
                "controller:\n  tick_s: 0.5\n  admission: file\n"
                f"  inventory_file: {tmp / 'nodes.yaml'}\n  energy_accounting: true\n"
                "  power_budgets: [{key: rack, value: r1, contract_kw: 100}]\n"
            )
            # The fabric row: agent-a an InfiniBand node with a running Fabric Manager (a /proc with its
            # process), agent-b a RoCE node, both as recorded sysfs trees (tests/fixtures/sysfs).
            fixtures = ROOT / "tests" / "fixtures" / "sysfs"
            sysfs = {
                "a": rdma.write_tree((fixtures / "cx7-ib-healthy.txt").read_text(), tmp / "sys-a"),
                "b": rdma.write_tree((fixtures / "cx6dx-roce-healthy.txt").read_text(), tmp / "sys-b"),
            }
            (tmp / "proc" / "4242").mkdir(parents=True)
            (tmp / "proc" / "4242" / "comm").write_text("nv-fabricmanager\n")
            fabric_env = {
                **os.environ,
                "HEALER_AGENT_FABRIC_MANAGER": "on",
                "HEALER_AGENT_PROC_ROOT": str(tmp / "proc"),
                "HEALER_AGENT_JOB_MAP_DIR": str(tmp / "jobs"),
            }
            commands = {
                "controller": [
                    "controller", "--nats", url, "--rules", str(ROOT / "rules"), "--mode", "dry-run",
                    "--actuator", "log", "--config", str(config),
                ],
                "agent-a": ["agent", "--nats", url, "--source", "sim", "--node", "gpu-a", "--interval", "0.5",
                            "--state-dir", str(tmp / "a"), "--provision", "--sysfs-root", str(sysfs["a"])],
                "agent-b": ["agent", "--nats", url, "--source", "sim", "--node", "gpu-b", "--interval", "0.5",
                            "--state-dir", str(tmp / "b"), "--provision", "--sysfs-root", str(sysfs["b"])],
                "forwarder": ["forward", "--nats", url, "--url", f"http://127.0.0.1:{receiver.server_port}/"],
            }  # fmt: skip
            for name, argv in commands.items():
                log = logs.enter_context((tmp / f"{name}.log").open("wb"))
                procs.append(
                    subprocess.Popen(
                        [*HEALER, *argv, "--metrics-port", str(ports[name])],
                        cwd=ROOT,
                        env=fabric_env if name == "agent-a" else None,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
            yield ports
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        receiver.shutdown()
        receiver.server_close()
        logs.close()


@contextlib.contextmanager
def _prometheus_server(tmp: pathlib.Path, targets: dict[str, int]) -> Iterator[str]:
    port = embedded.free_port()
    cfg = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": name,
                "static_configs": [{"targets": [f"127.0.0.1:{p}"], "labels": {"cluster": "ci"}}],
            }
            for name, p in targets.items()
        ],
    }
    (tmp / "prometheus.yml").write_text(json.dumps(cfg))  # JSON is YAML
    log = (tmp / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            _prometheus(),
            f"--config.file={tmp / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def _query(base: str, expr: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", (expr, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _wait_until_scraped(base: str, jobs: int, timeout: float = 60.0) -> None:
    """Every target up, and the GPU series (served after the agents' first frames) present."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, AssertionError):
            up = _query(base, "up == 1")
            gpus = _query(base, "DCGM_FI_DEV_GPU_TEMP")
            if len(up) == jobs and gpus:
                return
        time.sleep(0.5)
    raise AssertionError("Prometheus did not scrape every healer process in time")


AFTER_A_SCORED_WINDOW = frozenset({
    "Pools: live or shadow", "Anomaly incidents per 1,000 node-days", "Calibrated thresholds",
    "Shadow would-be incidents",
})  # fmt: skip
"""Panels of the anomaly calibration's pools: a pool exists from its nodes' first complete scoring window
(300 s of frames), longer than this test runs. Their queries are still sent (valid PromQL); their series
are tested where the pools are made (tests/anomaly, tests/controller)."""


def _fill(expr: str) -> str:
    return expr.replace("$cluster", "ci").replace("$instance", ".*")


def _empty_panels(prom: str, dashboard: dict[str, Any]) -> list[str]:
    return [
        f"{panel['title']}: {target['expr']}"
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        if panel["title"] not in AFTER_A_SCORED_WINDOW and not _query(prom, _fill(target["expr"]))
    ]


def test_every_panel_has_data_on_a_healthy_system(tmp_path: pathlib.Path) -> None:
    _prometheus()
    dashboard = json.loads((m.DEPLOY / "grafana" / "healer.json").read_text())
    with _processes(tmp_path) as ports, _prometheus_server(tmp_path, ports) as prom:
        _wait_until_scraped(prom, len(ports))
        time.sleep(4.0)  # a few more scrapes, so rate() has two samples in every window
        # The controller's periodic gauges (stream bytes, energy) come with its loops' first turns, which a
        # loaded machine delays: ask again until every panel has data or a minute has passed.
        deadline = time.monotonic() + 60.0
        while (empty := _empty_panels(prom, dashboard)) and time.monotonic() < deadline:
            time.sleep(1.0)
        for annotation in dashboard["annotations"]["list"]:
            _query(prom, _fill(annotation["expr"]))  # valid PromQL (empty while nothing happens)
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                inner = variable["definition"].removeprefix("label_values(").removesuffix(")")
                selector, label = inner.rsplit(",", 1)
                values = {s["metric"].get(label.strip()) for s in _query(prom, _fill(selector))}
                assert values - {None}, f"variable {variable['name']} would offer nothing"
    assert not empty, "panels that would show No data:\n" + "\n".join(empty)
