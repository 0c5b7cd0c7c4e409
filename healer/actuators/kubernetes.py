"""Kubernetes actuator: cordon, uncordon and migrate nodes through the official client.

- ``cordon``: PATCH the node (strategic merge) with ``spec.unschedulable: true``, the annotation
  ``healer.io/incident: <id>`` and, if configured, the taint ``healer.io/gpu-fault:NoSchedule``; then
  PATCH its status subresource with the condition ``GpuHealthy=False`` (reason, message), as
  node-problem-detector reports problems. A node an operator already cordoned is left exactly as it is.
- ``uncordon``: only when healer's annotation is there (and names this incident): condition back to
  ``GpuHealthy=True``, then annotation, taint and ``unschedulable`` removed.
- ``migrate``: cordon, then evict the node's pods through the Eviction API (policy/v1), which honours
  PodDisruptionBudgets. DaemonSet pods, mirror (static) pods and finished pods are skipped; 429 (a budget
  says not now) is retried with back-off until ``kube_evict_timeout_s``; 404 means the pod is gone
  already. Pods not moved are reported one by one.

- ``reboot_node``: Kubernetes has no reboot API; the node's own healer agent reboots it (``agent``, the
  GPU recovery actuator; the agent needs ``agent.reboot_command``). Only a node healer cordoned for this
  incident with no movable pod left (``migrate`` first) is rebooted; the annotation
  ``healer.io/reboot: <incident> <bootID>`` records the boot it left. ``reboot_status`` reads the
  completion from the kubelet: a new ``status.nodeInfo.bootID`` and ``Ready``. ``uncordon`` (return to
  service after validation) removes the annotation.

Taints are a plain list in a strategic merge patch (the Node type declares no merge key for them), so
the node patch carries the whole new list and the ``resourceVersion`` it was computed from: a concurrent
change makes the API answer 409 and the action is retried on fresh state.

Only this module and kube_client.py (how the official client is called) import ``kubernetes``. The
synchronous client runs in the actuator's bounded pool of worker threads, one ``ApiClient`` and its
connections shared by every call; responses are read as plain JSON (``_preload_content=False``).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import structlog
from kubernetes import client as k8s_client

from healer import config, errors
from healer.actuators import base, batching, kube_client
from healer.actuators.kube_client import ApiError, build_api_client
from healer.schemas import incidents

log = structlog.get_logger(__name__)

ANNOTATION = "healer.io/incident"
REBOOT_ANNOTATION = "healer.io/reboot"
TAINT_KEY = "healer.io/gpu-fault"
CONDITION = "GpuHealthy"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
SMP = "application/strategic-merge-patch+json"
MAX_BACKOFF_S = 60.0


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


HANDLERS: Final = base.handlers("kubernetes")
"""What this actuator carries out, one decorated method per request (a new scheduler verb adds one)."""


class KubernetesActuator:
    name = "kubernetes"

    def __init__(
        self,
        settings: config.ActuatorSettings | None = None,
        names: base.NodeNames | None = None,
        api_client: k8s_client.ApiClient | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        agent: base.Actuator | None = None,
    ) -> None:
        self.agent = agent
        """Who reboots a node (``reboot_node``): the node's agent, through the GPU recovery actuator."""
        self.settings = settings or config.ActuatorSettings()
        self.names = names or base.NodeNames(self.settings.node_name_template)
        self._api_client = api_client
        self._core_api: k8s_client.CoreV1Api | None = None
        self._sleep = sleep
        self._clock = clock
        self.pool = batching.BoundedPool(batching.KUBE_CONCURRENCY, "healer-kube")
        """The client's calls, a burst's cordons among them, run here: concurrent, bounded (#43)."""

    def close(self) -> None:
        self.pool.close()
        if self._api_client is not None:
            self._api_client.close()  # type: ignore[no-untyped-call]
            self._api_client = None
        self._core_api = None

    async def apply(self, request: base.ActionRequest) -> base.ActionOutcome:
        handlers = HANDLERS.bound(self)
        return await base.dispatch(self.name, self.settings, request, self.names(request.node), handlers)

    async def node_labels(self, nodes: Sequence[str]) -> dict[str, dict[str, str]]:
        """The Kubernetes labels of ``nodes`` (one ``list nodes`` call), by healer node name."""
        listed = await self._api("list_node")
        by_name = {
            str(item.get("metadata", {}).get("name")): dict(item.get("metadata", {}).get("labels") or {})
            for item in listed.get("items", [])
        }
        out: dict[str, dict[str, str]] = {}
        for node in nodes:
            labels = by_name.get(self.names(node))
            if labels is not None:
                out[node] = {str(k): str(v) for k, v in labels.items()}
        return out

    async def pods(self) -> list[dict[str, Any]]:
        """Every pod of the cluster (one ``list pods`` call): the job index reads which run on GPUs
        (controller/inventory/jobs.py ``placements_from_pods``)."""
        listed = await self._api("list_pod_for_all_namespaces")
        return list(listed.get("items") or [])

    # -- API calls ----------------------------------------------------------------------------------

    def _core(self) -> k8s_client.CoreV1Api:
        """One API object on one ``ApiClient`` (one connection pool, ``KUBE_CONCURRENCY`` connections
        kept open) for every call of this actuator."""
        if self._core_api is None:
            if self._api_client is None:
                self._api_client = build_api_client(self.settings)
            self._core_api = kube_client.CoreV1Api(self._api_client)
        return self._core_api

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run one client call in the pool; JSON body back, or ``ApiError`` / ``TemporaryError``."""
        return await kube_client.call(
            self.pool, self._core(), self.settings.call_timeout_s, method, *args, **kwargs
        )

    async def _api(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``_call`` with the usual meaning of codes: 409, 429 and 5xx retry; other errors are final."""
        try:
            return await self._call(method, *args, **kwargs)
        except ApiError as e:
            if e.code in (409, 429) or e.code >= 500:
                raise errors.TemporaryError(str(e), delay=1.0) from e
            raise errors.PermanentError(str(e)) from e

    async def _patch_node(self, node: str, body: dict[str, Any]) -> Any:
        return await self._api("patch_node", node, body, _content_type=SMP)

    async def _patch_status(self, node: str, body: dict[str, Any]) -> Any:
        return await self._api("patch_node_status", node, body, _content_type=SMP)

    # -- actions ------------------------------------------------------------------------------------

    @HANDLERS.handler("cordon")
    async def _cordon(self, node: str, request: base.ActionRequest) -> base.ActionOutcome:
        obj = await self._api("read_node", node)
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        annotations = meta.get("annotations") or {}
        cordoned, ours = bool(spec.get("unschedulable")), ANNOTATION in annotations
        if cordoned and not ours:
            return base.ActionOutcome(
                status="already-done",
                detail=f"{node} already cordoned by an operator; left as is",
                dry_run=request.dry_run,
            )
        steps: list[tuple[str, dict[str, Any]]] = []
        taints = list(spec.get("taints") or [])
        want_taint = self.settings.kube_taint and not any(t.get("key") == TAINT_KEY for t in taints)
        if not cordoned or want_taint:
            patch: dict[str, Any] = {
                "metadata": {"annotations": {ANNOTATION: request.incident_id}},
                "spec": {"unschedulable": True},
            }
            if want_taint:
                patch["metadata"]["resourceVersion"] = meta.get("resourceVersion")
                patch["spec"]["taints"] = [*taints, {"key": TAINT_KEY, "effect": "NoSchedule"}]
            if ours:
                del patch["metadata"]["annotations"]
            steps.append((f"PATCH /api/v1/nodes/{node}", patch))
        if _condition(obj) != "False":
            message = f"{base.REASON_PREFIX} {request.incident_id} {request.summary}".strip()
            now = _now()
            condition = {
                "type": CONDITION,
                "status": "False",
                "reason": str(request.params.get("condition_reason", "GpuFault")),
                "message": message[:1024],
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            steps.append((f"PATCH /api/v1/nodes/{node}/status", {"status": {"conditions": [condition]}}))
        if not steps:
            return base.ActionOutcome(
                status="already-done",
                detail=f"{node} already cordoned by healer ({annotations[ANNOTATION]})",
                dry_run=request.dry_run,
            )
        return await self._run_steps(node, steps, request, f"cordoned {node}")

    @HANDLERS.handler("uncordon")
    async def _uncordon(self, node: str, request: base.ActionRequest) -> base.ActionOutcome:
        obj = await self._api("read_node", node)
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        owner = (meta.get("annotations") or {}).get(ANNOTATION)
        if owner is None:
            if spec.get("unschedulable"):
                return base.ActionOutcome(
                    status="refused",
                    detail=f"{node} was cordoned by an operator; healer leaves it cordoned",
                    dry_run=request.dry_run,
                )
            return base.ActionOutcome(
                status="already-done", detail=f"{node} is schedulable", dry_run=request.dry_run
            )
        if owner != request.incident_id and not request.params.get("any_incident"):
            return base.ActionOutcome(
                status="refused",
                detail=f"{node} cordoned by healer for incident {owner}, not {request.incident_id}",
                dry_run=request.dry_run,
            )
        now = _now()
        condition = {
            "type": CONDITION,
            "status": "True",
            "reason": "GpuHealthy",
            "message": f"{base.REASON_PREFIX} {request.incident_id} resolved",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        patch: dict[str, Any] = {
            "metadata": {"annotations": {ANNOTATION: None, REBOOT_ANNOTATION: None}},
            "spec": {"unschedulable": None},
        }
        taints = list(spec.get("taints") or [])
        if any(t.get("key") == TAINT_KEY for t in taints):
            patch["metadata"]["resourceVersion"] = meta.get("resourceVersion")
            patch["spec"]["taints"] = [t for t in taints if t.get("key") != TAINT_KEY] or None
        steps = [
            (f"PATCH /api/v1/nodes/{node}/status", {"status": {"conditions": [condition]}}),
            (f"PATCH /api/v1/nodes/{node}", patch),
        ]
        return await self._run_steps(node, steps, request, f"uncordoned {node}")

    @HANDLERS.handler("reboot_node")
    async def _reboot(self, node: str, request: base.ActionRequest) -> base.ActionOutcome:
        obj = await self._api("read_node", node)
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        annotations = meta.get("annotations") or {}
        owner = annotations.get(ANNOTATION)
        if not spec.get("unschedulable") or owner != request.incident_id:
            who = (
                "nobody"
                if not spec.get("unschedulable")
                else (f"incident {owner}" if owner else "an operator")
            )
            return base.ActionOutcome(
                status="refused",
                detail=f"{node} is cordoned by {who}, not by healer for {request.incident_id}: no reboot",
                dry_run=request.dry_run,
            )
        boot_id = str(((obj.get("status") or {}).get("nodeInfo") or {}).get("bootID") or "")
        pending = str(annotations.get(REBOOT_ANNOTATION) or "").split()
        if pending[:1] == [request.incident_id]:
            return base.ActionOutcome(
                status="already-done",
                detail=f"{node}: reboot already requested for {request.incident_id}",
                dry_run=request.dry_run,
            )
        pods = await self._api("list_pod_for_all_namespaces", field_selector=f"spec.nodeName={node}")
        left = [
            f"{(p.get('metadata') or {}).get('namespace')}/{(p.get('metadata') or {}).get('name')}"
            for p in pods.get("items") or []
            if not _skip_reason(p)
        ]
        if left:
            return base.ActionOutcome(
                status="refused",
                detail=f"{node} still runs {len(left)} pod(s) ({', '.join(left[:5])}): migrate first",
                dry_run=request.dry_run,
            )
        patch = {"metadata": {"annotations": {REBOOT_ANNOTATION: f"{request.incident_id} {boot_id}"}}}
        plan = [
            f"PATCH /api/v1/nodes/{node} {SMP} {json.dumps(patch, sort_keys=True)}",
            f"reboot_node through the agent of {request.node}",
        ]
        if request.dry_run:
            return base.ActionOutcome(
                status="planned", detail=f"would reboot {node} through its agent", plan=plan, dry_run=True
            )
        if self.agent is None:
            raise errors.PermanentError(
                "no way to reboot a Kubernetes node: the agent path is not configured"
            )
        await self._patch_node(node, patch)
        out = await self.agent.apply(request)
        if out.status not in incidents.TOOK_EFFECT:
            await self._patch_node(node, {"metadata": {"annotations": {REBOOT_ANNOTATION: None}}})
            return out.model_copy(
                update={"plan": plan, "detail": f"the agent did not reboot {node}: {out.detail}"}
            )
        return base.ActionOutcome(status="done", detail=f"reboot of {node} started by its agent", plan=plan)

    async def reboot_status(self, node: str) -> base.RebootStatus:
        """How far healer's reboot of ``node`` (healer's name) got: ``issued`` until the kubelet reports a
        new bootID and Ready, then ``complete``; ``none`` without healer's reboot annotation."""
        obj = await self._api("read_node", self.names(node))
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        pending = str(annotations.get(REBOOT_ANNOTATION) or "").split()
        if not pending:
            return base.RebootStatus(base.RebootPhase.NONE)
        before = pending[1] if len(pending) > 1 else ""
        status = obj.get("status") or {}
        boot_id = str((status.get("nodeInfo") or {}).get("bootID") or "")
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        phase = base.RebootPhase.COMPLETE if boot_id != before and ready else base.RebootPhase.ISSUED
        return base.RebootStatus(phase, reason=" ".join(pending))

    async def _run_steps(
        self, node: str, steps: list[tuple[str, dict[str, Any]]], request: base.ActionRequest, done: str
    ) -> base.ActionOutcome:
        plan = [f"{what} {SMP} {json.dumps(body, sort_keys=True)}" for what, body in steps]
        if request.dry_run:
            return base.ActionOutcome(status="planned", detail=f"would have {done}", plan=plan, dry_run=True)
        latest: dict[str, Any] | None = None
        for what, body in steps:
            if latest is not None and "resourceVersion" in body.get("metadata", {}):
                # the previous step changed the node: its answer carries the version to build on
                body = {**body, "metadata": {**body["metadata"], "resourceVersion": _version(latest)}}
            if what.endswith("/status"):
                latest = await self._patch_status(node, body)
            else:
                latest = await self._patch_node(node, body)
        return base.ActionOutcome(status="done", detail=done, plan=plan)

    @HANDLERS.handler("migrate")
    async def _migrate(self, node: str, request: base.ActionRequest) -> base.ActionOutcome:
        cordon = await self._cordon(node, request)
        pods = await self._api("list_pod_for_all_namespaces", field_selector=f"spec.nodeName={node}")
        items: list[base.ItemResult] = []
        to_evict: list[tuple[str, str]] = []
        for pod in pods.get("items") or []:
            meta = pod.get("metadata") or {}
            ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
            why = _skip_reason(pod)
            if why:
                items.append(base.ItemResult(item=f"pod {ns}/{name}", status="skipped", detail=why))
            else:
                to_evict.append((ns, name))
        plan = [
            *cordon.plan,
            *(f"POST /api/v1/namespaces/{ns}/pods/{name}/eviction" for ns, name in to_evict),
        ]
        if request.dry_run:
            items += [
                base.ItemResult(item=f"pod {ns}/{n}", status="planned", detail="would evict")
                for ns, n in to_evict
            ]
            return base.ActionOutcome(
                status="planned",
                detail=f"{cordon.detail}; would evict {len(to_evict)} pod(s)",
                items=items,
                plan=plan,
                dry_run=True,
            )
        until = self._clock() + self.settings.kube_evict_timeout_s
        items += await asyncio.gather(*(self._evict(ns, name, until) for ns, name in to_evict))
        failures = [i for i in items if i.status.startswith("failed")]
        if failures:
            status = base.worst(failures)
        elif cordon.status == incidents.ActionStatus.DONE or any(
            i.status == incidents.ActionStatus.DONE for i in items
        ):
            status = incidents.ActionStatus.DONE
        else:
            status = incidents.ActionStatus.ALREADY_DONE
        moved = sum(i.status in incidents.TOOK_EFFECT for i in items)
        return base.ActionOutcome(
            status=status,
            detail=f"{cordon.detail}; {moved} of {len(to_evict)} pod(s) evicted",
            items=items,
            plan=plan,
        )

    async def _evict(self, namespace: str, name: str, until: float) -> base.ItemResult:
        item = f"pod {namespace}/{name}"
        body = kube_client.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=kube_client.V1ObjectMeta(name=name, namespace=namespace),
        )
        backoff = self.settings.kube_evict_backoff_s
        while True:
            try:
                await self._call(
                    "create_namespaced_pod_eviction", name, namespace, body, _content_type="application/json"
                )
                return base.ItemResult(item=item, status="done", detail="evicted")
            except ApiError as e:
                if e.code == 404:
                    return base.ItemResult(item=item, status="already-done", detail="pod already gone")
                if e.code not in (409, 429) and e.code < 500:
                    return base.ItemResult(item=item, status="failed-permanent", detail=f"not moved: {e}")
                last = f"not moved: {e}"
            except errors.TemporaryError as e:
                last = f"not moved: {e}"
            if self._clock() + backoff > until:
                return base.ItemResult(item=item, status="failed-temporary", detail=last)
            log.info("kubernetes.eviction_retry", pod=item, detail=last, backoff_s=backoff)
            await self._sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)


def _version(obj: Any) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return str(meta["resourceVersion"]) if isinstance(meta, dict) and "resourceVersion" in meta else None


def _condition(node: dict[str, Any]) -> str | None:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == CONDITION:
            return str(cond.get("status"))
    return None


def _skip_reason(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return "mirror (static) pod: the kubelet owns it, eviction cannot move it"
    if any(ref.get("kind") == "DaemonSet" for ref in meta.get("ownerReferences") or []):
        return "DaemonSet pod: it belongs on this node"
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return "pod has finished"
    return ""
