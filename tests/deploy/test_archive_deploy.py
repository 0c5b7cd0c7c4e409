"""The archive's systemd unit and Kubernetes Deployment run a command line the real CLI parses, keep the
archive on durable storage, and are probed and hardened like the other feed consumers (#42)."""

from __future__ import annotations

import configparser
import pathlib
import shlex

from healer import cli
from tests.deploy import manifests as m
from tests.deploy import test_status_page_and_bridge as ports


def _service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((m.DEPLOY / "systemd" / "healer-archive.service").read_text())
    assert {"Unit", "Service", "Install"} <= set(parser.sections())
    return parser["Service"]


def test_the_unit_archives_into_its_state_directory_unprivileged_with_a_watchdog() -> None:
    svc = _service()
    argv = shlex.split(svc["ExecStart"])
    assert argv[0] == "/opt/healer/bin/healer"
    args = cli.build_parser().parse_args(argv[1:])
    assert args.command == "archive"
    assert pathlib.PurePath(args.db).parent == pathlib.PurePath("/var/lib") / svc["StateDirectory"]
    assert args.metrics_port == ports.ports_table()["archive"]
    assert (svc["Type"], svc["NotifyAccess"], int(svc["WatchdogSec"]) >= 10) == ("notify", "main", True)
    assert (svc["User"], svc["CapabilityBoundingSet"], svc["NoNewPrivileges"]) == ("healer", "", "yes")
    assert (svc["ProtectSystem"], svc["PrivateDevices"], svc["Restart"]) == ("strict", "yes", "always")


def test_the_deployment_keeps_one_writer_on_a_claim_probed_on_its_health_endpoints() -> None:
    doc = m.find("Deployment", "healer-archive")
    pod = doc["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = cli.build_parser().parse_args(container["args"])
    assert args.command == "archive"
    assert args.durable == "healer-archive"
    assert (doc["spec"]["replicas"], doc["spec"]["strategy"]["type"]) == (1, "Recreate")
    _, data = m.mounted_at(pod, container, str(args.db))
    claim = data["persistentVolumeClaim"]["claimName"]
    assert m.find("PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert (
        container["securityContext"]["readOnlyRootFilesystem"] is True
    )  # the claim is the one place written
    assert args.metrics_port == ports.ports_table()["archive"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"metrics": args.metrics_port}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    _, identity = m.mounted_at(pod, container, args.config)
    assert identity["secret"]["secretName"] == "healer-archive-nats"
    assert pathlib.PurePath(args.config).parent.name == "feeds"  # a read-only feed identity
