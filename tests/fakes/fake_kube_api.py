"""A strict fake Kubernetes API server for the Kubernetes actuator's tests.

It stands in for kube-apiserver because none can run on the test machines (no Debian or PyPI package
ships one and its downloads are unreachable). It serves exactly the calls the actuator makes, with the
real paths, verbs, content types, bodies and status codes, on a loopback port, and refuses the rest:

- ``GET    /api/v1/nodes``                                         200 (a NodeList; no selectors)
- ``GET    /api/v1/nodes/{name}``                                  200, 404
- ``PATCH  /api/v1/nodes/{name}``         strategic-merge or merge patch: 200, 404, 409 (resourceVersion)
- ``PATCH  /api/v1/nodes/{name}/status``  the same; ``status.conditions`` merge by ``type``
- ``GET    /api/v1/pods?fieldSelector=spec.nodeName=X``             200
- ``POST   /api/v1/namespaces/{ns}/pods/{name}/eviction``  policy/v1 Eviction: 201, 404, 429 (a
  PodDisruptionBudget said no), 500 (several budgets match the pod)

Any other path is 404, any other verb on a known path 405, any other patch type 415, a request without
the bearer token 401, and a request the RBAC rules it is given do not allow 403, so a missing rule in
deploy/ fails a test. Errors come back as ``Status`` objects, as the real server sends them. ``fail``
injects a status code for the next matching calls. Every request is recorded. As the real server, it
speaks HTTP/1.1 and keeps a connection open between requests (keep-alive).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterable
from http import server
from typing import Any

import yaml

SMP = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"

ROUTES: list[tuple[re.Pattern[str], dict[str, tuple[str, str]]]] = [
    (re.compile(r"^/api/v1/nodes$"), {"GET": ("list", "nodes")}),
    (re.compile(r"^/api/v1/nodes/([^/]+)$"), {"GET": ("get", "nodes"), "PATCH": ("patch", "nodes")}),
    (re.compile(r"^/api/v1/nodes/([^/]+)/status$"), {"PATCH": ("patch", "nodes/status")}),
    (re.compile(r"^/api/v1/pods$"), {"GET": ("list", "pods")}),
    (
        re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/eviction$"),
        {"POST": ("create", "pods/eviction")},
    ),
]
"""path pattern → verb → (RBAC verb, RBAC resource)."""

MERGE_KEYS = {("status", "conditions"): "type"}
"""Lists that strategic merge patch merges by key (as the Node type declares); other lists are replaced."""


REASONS = {404: "NotFound", 409: "Conflict", 429: "TooManyRequests", 500: "InternalError"}


@dataclasses.dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    body: Any
    verb: str
    resource: str
    status: int = 0


@dataclasses.dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    status: int
    times: int


def cluster_role_rules(rbac_yaml: str) -> list[dict[str, Any]]:
    """The rules of the one ClusterRole in an RBAC manifest (deploy/kubernetes/rbac.yaml)."""
    [role] = [d for d in yaml.safe_load_all(rbac_yaml) if d and d.get("kind") == "ClusterRole"]
    rules: list[dict[str, Any]] = role["rules"]
    return rules


def status_body(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def strategic_merge(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return copy.deepcopy(patch)
    out = dict(target)
    for key, value in patch.items():
        here = (*path, key)
        if value is None:
            out.pop(key, None)
        elif here in MERGE_KEYS and isinstance(value, list):
            merge_key = MERGE_KEYS[here]
            items = [dict(i) for i in out.get(key) or []]
            for item in value:
                match = next((i for i in items if i.get(merge_key) == item.get(merge_key)), None)
                if match is None:
                    items.append(dict(item))
                else:
                    match.update(item)
            out[key] = items
        else:
            out[key] = strategic_merge(out.get(key), value, here)
    return out


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class FakeKubeAPI:
    def __init__(self, token: str = "test-token", rbac_rules: Iterable[dict[str, Any]] | None = None) -> None:
        self.token = token
        self.allowed: set[tuple[str, str]] | None = None
        if rbac_rules is not None:
            self.allowed = {
                (verb, resource)
                for rule in rbac_rules
                if "" in rule.get("apiGroups", [])
                for resource in rule.get("resources", [])
                for verb in rule.get("verbs", [])
            }
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.pdb_refusals: dict[tuple[str, str], int] = {}
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.lock = threading.Lock()
        self.latency_s = 0.0
        """Each request is answered this much later (an API server's round trip), outside the lock."""
        self.in_flight = 0
        self.max_in_flight = 0
        """The most requests this server was answering at once."""
        self._flight = threading.Lock()
        self._open: set[socket.socket] = set()
        self.connections = 0
        """Connections accepted so far (a client that keeps them open makes few)."""
        """The connections being served (kept alive between requests), closed by ``stop``."""
        self._version = 100
        self._httpd: server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- state --------------------------------------------------------------------------------------

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def add_node(
        self,
        name: str,
        *,
        unschedulable: bool = False,
        annotations: dict[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        spec: dict[str, Any] = {"podCIDR": "10.0.0.0/24"}
        if unschedulable:
            spec["unschedulable"] = True
        if taints:
            spec["taints"] = taints
        self.nodes[name] = {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "uid": f"uid-{name}",
                "resourceVersion": self._next_version(),
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
                "annotations": dict(annotations or {}),
            },
            "spec": spec,
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                "nodeInfo": {"bootID": f"{name}-boot-0", "kubeletVersion": "v1.30.0"},
            },
        }

    def boot(self, name: str, *, ready: bool = True) -> None:
        """What the kubelet reports after its host rebooted: a new ``status.nodeInfo.bootID`` (and
        ``Ready``, once it is)."""
        with self.lock:
            node = self.nodes[name]
            info = node["status"]["nodeInfo"]
            n = int(info["bootID"].rsplit("-", 1)[1]) + 1
            info["bootID"] = f"{name}-boot-{n}"
            for cond in node["status"]["conditions"]:
                if cond["type"] == "Ready":
                    cond["status"] = "True" if ready else "Unknown"
            node["metadata"]["resourceVersion"] = self._next_version()

    def add_pod(
        self,
        namespace: str,
        name: str,
        node: str,
        *,
        owner_kind: str | None = "ReplicaSet",
        mirror: bool = False,
        phase: str = "Running",
        pdb_refusals: int = 0,
        gpus: int = 0,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        priority_class: tuple[str, int] | None = None,
    ) -> None:
        """A pod; ``priority_class``: (name, value) of its PriorityClass, which the real API server's
        Priority admission plugin writes into ``spec.priorityClassName`` and ``spec.priority``."""
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"}
        if owner_kind:
            metadata["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": owner_kind,
                    "name": f"{name}-owner",
                    "uid": "o",
                    "controller": True,
                }
            ]
        if mirror:
            metadata["annotations"] = {"kubernetes.io/config.mirror": "abc"}
        if annotations:
            metadata["annotations"] = {**metadata.get("annotations", {}), **annotations}
        if labels:
            metadata["labels"] = dict(labels)
        container: dict[str, Any] = {"name": "main", "image": "busybox"}
        if gpus:
            container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
        spec: dict[str, Any] = {"nodeName": node, "containers": [container]}
        if priority_class is not None:
            spec["priorityClassName"], spec["priority"] = priority_class
        self.pods[(namespace, name)] = {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": metadata,
            "spec": spec,
            "status": {"phase": phase},
        }
        if pdb_refusals:
            self.pdb_refusals[(namespace, name)] = pdb_refusals

    def fail(self, method: str, path: str, status: int, times: int = 1) -> None:
        """Answer the next ``times`` requests ``method path`` (a regex) with ``status``."""
        self.faults.append(Fault(method, re.compile(path), status, times))

    def calls(self) -> set[tuple[str, str]]:
        """(RBAC verb, resource) of every request answered so far."""
        return {(r.verb, r.resource) for r in self.requests}

    # -- serving ------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> str:
        fake = self

        class Handler(server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            """As kube-apiserver: connections stay open between requests (keep-alive); every answer
            carries its Content-Length."""
            disable_nagle_algorithm = True
            """As kube-apiserver (Go sets TCP_NODELAY on every connection): else, on a kept-alive
            connection, an answer's body waits for the client to acknowledge its headers (up to 40 ms)."""

            def setup(self) -> None:
                super().setup()
                with fake._flight:
                    fake._open.add(self.connection)
                    fake.connections += 1

            def finish(self) -> None:
                with fake._flight:
                    fake._open.discard(self.connection)
                super().finish()

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake._handle(self, "GET")

            def do_PATCH(self) -> None:
                fake._handle(self, "PATCH")

            def do_POST(self) -> None:
                fake._handle(self, "POST")

            def do_PUT(self) -> None:
                fake._handle(self, "PUT")

            def do_DELETE(self) -> None:
                fake._handle(self, "DELETE")

        self._httpd = server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="fake-kube-api", daemon=True
        )
        self._thread.start()
        return self.url

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        with self._flight:
            still_open, self._open = list(self._open), set()
        for conn in still_open:  # a client's kept-alive connection: its handler thread ends here
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def write_kubeconfig(self, path: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "healer", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "healer"}}],
            "current-context": "fake",
        }
        with open(path, "w") as f:
            json.dump(config, f)

    def _handle(self, req: server.BaseHTTPRequestHandler, method: str) -> None:
        url = urllib.parse.urlsplit(req.path)
        query = urllib.parse.parse_qs(url.query)
        length = int(req.headers.get("Content-Length") or 0)
        raw = req.rfile.read(length) if length else b""
        content_type = (req.headers.get("Content-Type") or "").split(";")[0].strip()
        with self._flight:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.latency_s:
                time.sleep(self.latency_s)
            with self.lock:
                code, body = self._answer(req, method, url.path, query, content_type, raw)
        finally:
            with self._flight:
                self.in_flight -= 1
        data = json.dumps(body).encode()
        req.send_response(code)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

    def _answer(
        self,
        req: server.BaseHTTPRequestHandler,
        method: str,
        path: str,
        query: dict[str, list[str]],
        content_type: str,
        raw: bytes,
    ) -> tuple[int, dict[str, Any]]:
        for pattern, verbs in ROUTES:  # noqa: B007 (used after the loop)
            match = pattern.match(path)
            if match:
                break
        else:
            return 404, status_body(404, "NotFound", "the server could not find the requested resource")
        if method not in verbs:
            return 405, status_body(
                405, "MethodNotAllowed", f"the server does not allow this method: {method}"
            )
        verb, resource = verbs[method]
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            return 400, status_body(400, "BadRequest", "the request body is not JSON")
        record = Recorded(method, path, query, content_type, body, verb, resource)
        self.requests.append(record)
        code, answer = self._dispatch(req, method, match, query, content_type, body, verb, resource)
        record.status = code
        return code, answer

    def _dispatch(
        self,
        req: server.BaseHTTPRequestHandler,
        method: str,
        match: re.Match[str],
        query: dict[str, list[str]],
        content_type: str,
        body: Any,
        verb: str,
        resource: str,
    ) -> tuple[int, dict[str, Any]]:
        if req.headers.get("Authorization") != f"Bearer {self.token}":
            return 401, status_body(401, "Unauthorized", "Unauthorized")
        if self.allowed is not None and (verb, resource) not in self.allowed:
            name, _, sub = resource.partition("/")
            return 403, status_body(
                403,
                "Forbidden",
                f'{name} is forbidden: User cannot {verb} resource "{name}"'
                + (f' in subresource "{sub}"' if sub else ""),
            )
        for fault in self.faults:
            if fault.times > 0 and fault.method == method and fault.path.search(match.group(0)):
                fault.times -= 1
                reason = REASONS.get(fault.status, "InternalError")
                return fault.status, status_body(fault.status, reason, f"injected {fault.status} {reason}")
        if resource == "nodes" and verb == "list":
            if query:
                return 400, status_body(400, "BadRequest", f"this fake lists nodes without {sorted(query)}")
            meta = {"resourceVersion": str(self._version)}
            items = copy.deepcopy(list(self.nodes.values()))
            return 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": meta, "items": items}
        if resource in ("nodes", "nodes/status"):
            return self._node(method, match.group(1), content_type, body, resource)
        if resource == "pods":
            return self._list_pods(query)
        return self._evict(match.group(1), match.group(2), content_type, body)

    def _node(
        self, method: str, name: str, content_type: str, body: Any, resource: str
    ) -> tuple[int, dict[str, Any]]:
        node = self.nodes.get(name)
        if node is None:
            return 404, status_body(404, "NotFound", f'nodes "{name}" not found', name=name, kind="nodes")
        if method == "GET":
            return 200, node
        if content_type not in (SMP, MERGE):
            return 415, status_body(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include: "
                f"{SMP}, {MERGE}",
            )
        if not isinstance(body, dict):
            return 400, status_body(400, "BadRequest", "patch body must be a JSON object")
        if resource == "nodes" and "status" in body:
            body = {k: v for k, v in body.items() if k != "status"}  # the main resource ignores status
        if resource == "nodes/status":
            body = {k: v for k, v in body.items() if k in ("status", "metadata")}
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != node["metadata"]["resourceVersion"]:
            return 409, status_body(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on nodes "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                name=name,
                kind="nodes",
            )
        merged = strategic_merge(node, body) if content_type == SMP else merge_patch(node, body)
        merged["metadata"]["resourceVersion"] = self._next_version()
        self.nodes[name] = merged
        return 200, merged

    def _list_pods(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        selectors = query.get("fieldSelector", [])
        node = None
        for selector in selectors:
            key, _, value = selector.partition("=")
            if key != "spec.nodeName":
                return 400, status_body(400, "BadRequest", f'"{key}" is not a known field selector')
            node = value
        items = [p for p in self.pods.values() if node is None or p["spec"]["nodeName"] == node]
        meta = {"resourceVersion": str(self._version)}
        return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": copy.deepcopy(items)}

    def _evict(self, namespace: str, name: str, content_type: str, body: Any) -> tuple[int, dict[str, Any]]:
        if content_type not in ("application/json", ""):  # no Content-Type: the server's first, JSON
            return 415, status_body(
                415, "UnsupportedMediaType", "the body of the request was in an unknown format"
            )
        if (
            not isinstance(body, dict)
            or body.get("apiVersion") != "policy/v1"
            or body.get("kind") != "Eviction"
            or (body.get("metadata") or {}).get("name") != name
        ):
            return 400, status_body(
                400, "BadRequest", f"name in URL does not match name in Eviction object: {body}"
            )
        if (namespace, name) not in self.pods:
            return 404, status_body(404, "NotFound", f'pods "{name}" not found', name=name, kind="pods")
        refusals = self.pdb_refusals.get((namespace, name), 0)
        if refusals:
            self.pdb_refusals[(namespace, name)] = refusals - 1
            return 429, status_body(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                causes=[
                    {
                        "reason": "DisruptionBudget",
                        "message": "The disruption budget web needs 1 healthy pods and has 1 currently",
                    }
                ],
            )
        del self.pods[(namespace, name)]
        return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
