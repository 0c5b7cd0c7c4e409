"""The Kubernetes manifests parse, hang together, and give each process what its command line needs."""

from __future__ import annotations

import argparse
import pathlib
import re
import shlex
from typing import Any

import pytest
import yaml

from healer import cli
from healer.cli import controller_cmd
from healer.rules import loader
from tests.deploy import manifests as m

DOCS = m.documents()


def _pod(workload: dict[str, Any]) -> dict[str, Any]:
    """The pod spec, with a StatefulSet's volume claim templates among its volumes."""
    spec: dict[str, Any] = dict(workload["spec"]["template"]["spec"])
    claims = workload["spec"].get("volumeClaimTemplates", [])
    spec["volumes"] = [
        *spec.get("volumes", []),
        *({"name": c["metadata"]["name"], "persistentVolumeClaim": {}} for c in claims),
    ]
    return spec


def test_every_document_has_the_required_fields() -> None:
    assert DOCS
    for doc in DOCS:
        where = f"{doc['__file__']}: {doc.get('kind')}"
        assert doc.get("apiVersion"), where
        assert doc.get("kind"), where
        assert doc.get("metadata", {}).get("name"), where
        if doc["kind"] not in m.CLUSTER_SCOPED:
            assert doc["metadata"].get("namespace") == "healer", where


def test_no_two_documents_define_the_same_object() -> None:
    keys = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in DOCS]
    assert len(keys) == len(set(keys))


def test_kustomization_lists_every_manifest() -> None:
    kust = yaml.safe_load((m.KUBE / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(p.name for p in m.manifest_files())


@pytest.mark.parametrize(
    "doc", [d for d in DOCS if d["kind"] in m.WORKLOADS], ids=lambda d: d["metadata"]["name"]
)
def test_workload_selectors_match_template_labels_and_containers_are_complete(doc: dict[str, Any]) -> None:
    selector = doc["spec"]["selector"]["matchLabels"]
    labels = doc["spec"]["template"]["metadata"]["labels"]
    assert selector
    assert selector.items() <= labels.items()
    for c in _pod(doc)["containers"]:
        assert c["image"], c["name"]
        assert ":" in c["image"], "pin an image tag"
        assert c.get("args"), c["name"]
        assert all(isinstance(a, str) for a in c["args"]), "quote numbers in args"
        assert c.get("resources", {}).get("requests"), c["name"]


def test_disruption_budgets_and_services_select_a_workload() -> None:
    label_sets = [d["spec"]["template"]["metadata"]["labels"] for d in DOCS if d["kind"] in m.WORKLOADS]
    for doc in DOCS:
        if doc["kind"] == "PodDisruptionBudget":
            selector = doc["spec"]["selector"]["matchLabels"]
        elif doc["kind"] == "Service":
            selector = doc["spec"]["selector"]
        else:
            continue
        assert any(selector.items() <= labels.items() for labels in label_sets), doc["metadata"]["name"]


def test_every_referenced_service_account_config_map_and_secret_exists_or_is_documented() -> None:
    defined = {(d["kind"], d["metadata"]["name"]) for d in DOCS}
    docs_page = (m.ROOT / "docs" / "deployment.md").read_text()
    for doc in DOCS:
        if doc["kind"] not in m.WORKLOADS:
            continue
        pod = _pod(doc)
        assert ("ServiceAccount", pod["serviceAccountName"]) in defined, pod["serviceAccountName"]
        for vol in pod.get("volumes", []):
            if "configMap" in vol:
                ref = ("ConfigMap", vol["configMap"]["name"])
            elif "secret" in vol:
                ref = ("Secret", vol["secret"]["secretName"])
            else:
                continue
            assert ref in defined or ref in m.EXTERNAL, ref
            if ref in m.EXTERNAL:
                assert ref[1] in docs_page, (
                    f"{ref} is created by hand but docs/deployment.md does not say how"
                )


def test_agent_daemonset_gives_the_agent_what_its_command_line_needs() -> None:
    ds = m.find("DaemonSet", "healer-agent")
    pod = _pod(ds)
    (agent,) = pod["containers"]
    f = m.flags(agent["args"])
    assert agent["args"][0] == "agent"
    assert f["--source"] == "nvml"
    assert f["--interval"] == "1"
    # --node is the Kubernetes node name, from the downward API
    assert f["--node"] == "$(NODE_NAME)"
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # the spool and the power limits to restore survive a pod restart: a host path, writable
    mount_path, volume = m.mounted_at(pod, agent, f["--state-dir"])
    assert volume["hostPath"]["path"] == f["--state-dir"]
    assert not next(v for v in agent["volumeMounts"] if v["mountPath"] == mount_path).get("readOnly")
    # the per-node identity (settings + seed) comes from the host, read-only
    _, identity = m.mounted_at(pod, agent, f["--config"])
    assert "hostPath" in identity
    _, ca = m.mounted_at(pod, agent, env["HEALER_NATS_TLS_CA_FILE"]["value"])
    assert ca["configMap"]["name"] == "healer-nats-ca"
    # NVML: the NVIDIA runtime injects the driver's libraries and devices, for every GPU
    assert pod["runtimeClassName"] == "nvidia"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"]["value"]
    assert "nvidia.com/gpu" not in str(agent["resources"])  # watches GPUs, takes none from jobs
    # power limits: root with CAP_SYS_ADMIN only, not privileged
    sc = agent["securityContext"]
    assert sc.get("privileged", False) is False
    assert sc["capabilities"]["add"] == ["SYS_ADMIN", "SYSLOG"]  # SYSLOG: the kernel log
    _, kmsg = m.mounted_at(pod, agent, "/dev/kmsg")
    assert kmsg["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"] is True
    # runs on faulty, cordoned and tainted nodes too
    assert {"operator": "Exists"} in pod["tolerations"]
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    assert str(ports["metrics"]) == f["--metrics-port"] == "9741"
    assert pod["automountServiceAccountToken"] is False


def test_controller_deployment_starts_in_dry_run_with_two_replicas() -> None:
    dep = m.find("Deployment", "healer-controller")
    pod = _pod(dep)
    (ctl,) = pod["containers"]
    f = m.flags(ctl["args"])
    assert ctl["args"][0] == "controller"
    assert dep["spec"]["replicas"] == 2
    assert f["--mode"] == "dry-run"
    assert f["--actuator"] == "kubernetes"
    assert f["--nats"].startswith("tls://")
    assert pod["serviceAccountName"] == "healer-controller"
    _, rules = m.mounted_at(pod, ctl, f["--rules"])
    assert rules["configMap"]["name"] == "healer-rules"
    _, identity = m.mounted_at(pod, ctl, f["--config"])
    assert identity["secret"]["secretName"] == "healer-controller-nats"
    ports = {p["name"]: p["containerPort"] for p in ctl["ports"]}
    assert str(ports["metrics"]) == f["--metrics-port"] == "9742"
    sc = ctl["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    env = {e["name"]: e.get("value") for e in ctl["env"]}
    assert env["HEALER_NATS_REPLICAS"] == "3"


def test_nats_statefulset_is_a_three_node_jetstream_cluster() -> None:
    sts = m.find("StatefulSet", "healer-nats")
    assert sts["spec"]["replicas"] == 3
    svc = m.find("Service", sts["spec"]["serviceName"])
    assert svc["spec"]["clusterIP"] == "None"
    conf = m.find("ConfigMap", "healer-nats-config")["data"]["nats.conf"]
    routes = re.findall(r'"nats://([^".]+)\.([^".]+)\.healer\.svc\.cluster\.local:6222"', conf)
    assert routes == [(f"healer-nats-{i}", svc["metadata"]["name"]) for i in range(3)]
    assert "jetstream {" in conf
    pod = _pod(sts)
    (nats,) = pod["containers"]
    include = re.search(r'include "([^"]+)"', conf)
    assert include is not None
    _, auth = m.mounted_at(pod, nats, "/etc/nats/" + include.group(1))
    assert auth["secret"]["secretName"] == "healer-nats-auth"
    for path in re.findall(r'(?:cert|key|ca)_file: "([^"]+)"', conf):
        _, tls = m.mounted_at(pod, nats, path)
        assert tls["secret"]["secretName"] == "healer-nats-tls"
    store = re.search(r'store_dir: "([^"]+)"', conf)
    assert store is not None
    _, data = m.mounted_at(pod, nats, store.group(1))
    assert "persistentVolumeClaim" in data  # JetStream data outlives the pod


def test_rules_config_map_loads_with_the_rule_engine_without_warnings(tmp_path: pathlib.Path) -> None:
    """As the controller loads the mounted directory: one rule set (ladders in one file, rules naming
    them in another)."""
    cm = m.find("ConfigMap", "healer-rules")
    for name, text in cm["data"].items():
        assert name.endswith(".yaml")
        (tmp_path / name).write_text(text)
    result = loader.load_paths([tmp_path])
    assert result.ok, result.errors
    assert result.warnings == []
    assert result.ruleset is not None
    assert len(result.ruleset.rules) > 20  # the pack, not a starter subset


def test_image_runs_the_healer_command_so_args_start_with_the_subcommand() -> None:
    dockerfile = (m.DEPLOY / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["healer"]' in dockerfile
    subcommands = {
        _pod(d)["containers"][0]["args"][0]
        for d in DOCS
        if d["metadata"]["name"].startswith("healer-")
        and d["kind"] in m.WORKLOADS
        and d["metadata"]["name"] != "healer-nats"
    }
    assert subcommands == {"agent", "controller", "ui", "alertmanager", "archive"}


def test_agent_command_lines_parse_with_the_real_cli() -> None:
    """The DaemonSet's and the systemd unit's agent arguments are ones `healer agent` accepts."""
    parser = cli.build_parser()
    (agent,) = _pod(m.find("DaemonSet", "healer-agent"))["containers"]
    args = parser.parse_args([a.replace("$(NODE_NAME)", "gpu-1") for a in agent["args"]])
    assert (args.command, args.source, args.interval, args.metrics_port) == ("agent", "nvml", 1.0, 9741)
    unit = (m.DEPLOY / "systemd" / "healer-agent.service").read_text()
    (exec_start,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    argv = shlex.split(exec_start.removeprefix("ExecStart="))[1:]
    argv = [{"${HEALER_NODE}": "gpu-1", "${HEALER_NATS_URL}": "tls://nats:4222"}.get(a, a) for a in argv]
    args = parser.parse_args(argv)
    assert (args.command, args.state_dir, args.config) == (
        "agent",
        "/var/lib/healer",
        "/etc/healer/agent.yaml",
    )


def test_controller_command_lines_parse_with_the_real_cli() -> None:
    """The Deployment's and the systemd unit's controller arguments are ones `healer controller` accepts."""
    parser = argparse.ArgumentParser(prog="healer")
    controller_cmd.register(parser.add_subparsers(dest="command"))
    (ctl,) = _pod(m.find("Deployment", "healer-controller"))["containers"]
    args = parser.parse_args(ctl["args"])
    assert (args.mode, args.actuator, args.metrics_port) == ("dry-run", "kubernetes", 9742)
    unit = (m.DEPLOY / "systemd" / "healer-controller.service").read_text()
    (exec_start,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    argv = shlex.split(exec_start.removeprefix("ExecStart="))[1:]
    env = {"${HEALER_NATS_URL}": "tls://nats:4222", "${HEALER_ACTUATOR}": "slurm"}
    args = parser.parse_args([env.get(a, a) for a in argv])
    assert (args.mode, args.rules, args.config) == (
        "dry-run",
        "/etc/healer/rules",
        "/etc/healer/controller.yaml",
    )


def test_the_controller_image_ships_the_anomaly_model_its_manifests_pass() -> None:
    """The controller stage of the Dockerfile copies models/ where the Deployment's --model points, and
    the agent stage installs no extra (no scikit-learn, Kubernetes client or nats-server on GPU nodes)."""
    dockerfile = (m.DEPLOY / "Dockerfile").read_text()
    stages = dockerfile.split("\nFROM ")
    (agent,) = [s for s in stages if s.startswith("base AS agent")]
    (controller,) = [s for s in stages if s.startswith("base AS controller")]
    assert "pip install --no-cache-dir . " in agent
    assert "'.[controller]'" in controller
    assert "COPY models /usr/share/healer/models" in controller
    parser = argparse.ArgumentParser(prog="healer")
    controller_cmd.register(parser.add_subparsers(dest="command"))
    (ctl,) = _pod(m.find("Deployment", "healer-controller"))["containers"]
    model = parser.parse_args(ctl["args"]).model
    assert model.startswith("/usr/share/healer/models/")
    shipped = m.DEPLOY.parent / "models" / model.removeprefix("/usr/share/healer/models/")
    assert (shipped / "card.json").is_file()
    (agent_pod,) = _pod(m.find("DaemonSet", "healer-agent"))["containers"]
    assert agent_pod["image"].startswith("healer-agent:")
    assert ctl["image"].startswith("healer:")


@pytest.mark.parametrize(
    ("kind", "name"), [("DaemonSet", "healer-agent"), ("Deployment", "healer-controller")]
)
def test_probes_ask_the_health_endpoints_not_the_metrics_page(kind: str, name: str) -> None:
    (container,) = _pod(m.find(kind, name))["containers"]
    live, ready = container["livenessProbe"]["httpGet"], container["readinessProbe"]["httpGet"]
    assert (live["path"], live["port"]) == ("/healthz", "metrics")
    assert (ready["path"], ready["port"]) == ("/readyz", "metrics")
