"""The status page's and the Alertmanager bridge's Deployments, the PodMonitors, and the one table of
ports in docs/operations.md (issue #23): each command line parses with the real CLI, each port is the
documented one and matches its settings' default, its probes and its scrape object."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import yaml

from healer import cli, config
from tests.deploy import manifests as m

MONITORING = m.KUBE / "monitoring"


def _container(kind: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    doc = m.find(kind, name)
    pod = doc["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def ports_table() -> dict[str, int]:
    """`healer agent` -> 9741 ..., from docs/operations.md's "Ports" table."""
    text = (m.ROOT / "docs" / "operations.md").read_text()
    section = text.split("## Ports\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `healer (\w+)[^|]*\| (\d+) \|", section, flags=re.M)
    return {cmd: int(port) for cmd, port in rows}


def test_ports_are_distinct_and_match_the_settings_defaults() -> None:
    table = ports_table()
    assert set(table) >= {"agent", "controller", "forward", "ui", "alertmanager"}
    assert len(set(table.values())) == len(table), table
    s = config.Settings()
    assert table["agent"] == s.agent.metrics_port
    assert table["controller"] == s.controller.metrics_port
    assert table["ui"] == s.ui.port
    for page in ("alertmanager.md", "events.md"):  # the examples use the table's ports
        text = (m.ROOT / "docs" / page).read_text()
        for port in re.findall(r"--metrics-port (\d+)", text):
            assert int(port) in table.values(), (page, port)
    alert_doc = (m.ROOT / "docs" / "alertmanager.md").read_text()
    assert f"--metrics-port {table['alertmanager']}" in alert_doc
    assert f"--metrics-port {table['ui']}" not in alert_doc


def test_status_page_deployment_parses_listens_on_its_port_with_a_token_behind_a_service() -> None:
    pod, ui = _container("Deployment", "healer-ui")
    args = cli.build_parser().parse_args(ui["args"])
    assert args.command == "ui"
    assert args.port == ports_table()["ui"]
    assert args.host == "0.0.0.0"  # not loopback: the page refuses to start without a token ...
    env = {e["name"]: e for e in ui["env"]}
    assert env["HEALER_UI_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "healer-ui-token"  # ... it has one
    assert {p["name"]: p["containerPort"] for p in ui["ports"]} == {"http": args.port}
    assert ui["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}  # no token needed there
    svc = m.find("Service", "healer-ui")
    assert svc["spec"]["ports"] == [{"name": "http", "port": args.port, "targetPort": "http"}]
    _, identity = m.mounted_at(pod, ui, args.config)
    assert identity["secret"]["secretName"] == "healer-ui-nats"
    assert pathlib.PurePath(args.config).parent.name == "controllers"  # where `healer nats config` points
    assert pod["automountServiceAccountToken"] is False


def test_alertmanager_bridge_deployment_parses_and_serves_metrics_on_its_port() -> None:
    doc = m.find("Deployment", "healer-alertmanager")
    pod, bridge = _container("Deployment", "healer-alertmanager")
    args = cli.build_parser().parse_args(bridge["args"])
    assert args.command == "alertmanager"
    assert args.metrics_port == ports_table()["alertmanager"]
    assert args.url.startswith("http")
    assert args.durable
    assert doc["spec"]["strategy"]["type"] == "Recreate"
    assert {p["name"]: p["containerPort"] for p in bridge["ports"]} == {"metrics": args.metrics_port}
    assert bridge["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert doc["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(args.metrics_port)
    _, identity = m.mounted_at(pod, bridge, args.config)
    assert identity["secret"]["secretName"] == "healer-alertmanager-nats"
    assert pathlib.PurePath(args.config).parent.name == "feeds"


def _selects(monitor: dict[str, Any], labels: dict[str, str]) -> bool:
    return bool(monitor["spec"]["selector"]["matchLabels"].items() <= labels.items())


def test_every_metrics_port_has_a_pod_monitor_selecting_its_pods() -> None:
    kust = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    docs = [d for f in kust["resources"] for d in yaml.safe_load_all((MONITORING / f).read_text()) if d]
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PodMonitor"}
    assert all(d["apiVersion"] == "monitoring.coreos.com/v1" for d in docs)
    scraped = set()
    for workload in (d for d in m.documents() if d["kind"] in m.WORKLOADS):
        pod = workload["spec"]["template"]["spec"]
        ports = {p["name"] for c in pod["containers"] for p in c.get("ports", [])}
        if "metrics" not in ports or workload["metadata"]["name"] == "healer-nats":
            continue
        labels = workload["spec"]["template"]["metadata"]["labels"]
        matching = [mon for mon in monitors.values() if _selects(mon, labels)]
        assert len(matching) == 1, workload["metadata"]["name"]
        (endpoint,) = matching[0]["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] == "metrics"
        assert endpoint["path"] == "/metrics"
        assert any(r.get("targetLabel") == "cluster" for r in endpoint["relabelings"])  # the dashboard's
        scraped.add(workload["metadata"]["name"])
    assert scraped == {"healer-agent", "healer-controller", "healer-alertmanager", "healer-archive"}
