"""Loading deploy/ files for the tests: every Kubernetes document, container args as flags."""

from __future__ import annotations

import pathlib
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBE = DEPLOY / "kubernetes"

CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "RuntimeClass"}
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet"}

EXTERNAL = {
    ("Secret", "healer-nats-auth"),
    ("Secret", "healer-nats-tls"),
    ("Secret", "healer-controller-nats"),
    ("Secret", "healer-ui-nats"),
    ("Secret", "healer-alertmanager-nats"),
    ("Secret", "healer-archive-nats"),
    ("ConfigMap", "healer-nats-ca"),
}
"""Objects the operator creates from `healer nats config` output and their PKI (docs/deployment.md)."""


def manifest_files() -> list[pathlib.Path]:
    return sorted(p for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")


def documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in manifest_files():
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                doc["__file__"] = path.name
                docs.append(doc)
    return docs


def find(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def flags(args: list[str]) -> dict[str, str]:
    """``["agent", "--node", "x", "--flag"]`` → ``{"--node": "x", "--flag": ""}``."""
    out: dict[str, str] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else ""
            out[arg] = "" if nxt.startswith("--") else nxt
    return out


def mounts(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """mountPath → the volume mounted there."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    return {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts", [])}


def mounted_at(pod: dict[str, Any], container: dict[str, Any], path: str) -> tuple[str, dict[str, Any]]:
    """The mount whose directory holds ``path`` (longest match), as (mountPath, volume)."""
    best = max(
        (m for m in mounts(pod, container) if path == m or path.startswith(m.rstrip("/") + "/")),
        key=len,
        default=None,
    )
    assert best is not None, f"{path} is not on any volume"
    return best, mounts(pod, container)[best]
