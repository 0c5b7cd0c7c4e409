"""Which GPUs run the same job, across nodes: the peer groups fail-slow detection compares (#28).

Three sources, any of them enough:

- the frames: ``GpuSample.jobs``, filled by the agent from its job-mapping directory
  (``agent.job_map_dir``, the files a Slurm prolog writes for dcgm-exporter);
- Slurm: ``squeue --json``, each running job's node list (``placements_from_squeue``);
- Kubernetes: running pods that request ``nvidia.com/gpu`` (``placements_from_pods``), grouped by their
  Job / owner, on their node; with the device ids when the pod carries them (annotation
  ``DEVICES_ANNOTATION``), else for the node's GPUs as a whole.

What a frame says about a GPU wins over a scheduler's node-level placement (the agent sees the
device), a scheduler's device-level placement over a node-level one. ``job_of(node, gpu)`` is the one
question other parts ask (energy per job, the straggler scorer); ``groups()`` gives every job's members.
Nothing here does I/O: the controller's shell lists jobs and hands the placements in.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import numpy as np

from healer.schemas import framecols, telemetry

_INDEX: Final = np.array([framecols.COLUMN["index"]], dtype=np.intp)
DEVICES_ANNOTATION: Final = "healer.io/gpu-devices"
"""A pod annotation listing the GPU indices it was given (``"0,1,2,3"``); without it a GPU pod's job is
placed on the node's GPUs as a whole (the API server does not carry the device plugin's ids)."""
GPU_RESOURCE: Final = "nvidia.com/gpu"
JOB_LABELS: Final = ("batch.kubernetes.io/job-name", "job-name", "training.kubeflow.org/job-name")
"""Pod labels that name the job a pod belongs to, in this order; else its controller owner, else the pod."""


@dataclasses.dataclass(frozen=True, slots=True)
class Placement:
    """One job on one node: on the given GPU indices, or (``gpus`` None) on the node as a whole."""

    job: str
    node: str
    gpus: tuple[int, ...] | None = None


Member = tuple[str, int]
"""(node, GPU index)."""


class JobIndex:
    def __init__(self) -> None:
        self._from_frames: dict[Member, tuple[str, ...]] = {}
        self._known: dict[str, set[int]] = {}
        self._scheduled: dict[str, list[Placement]] = {}
        """Per source (``slurm``, ``kubernetes``): its last listing."""
        self._device: dict[Member, str] = {}
        self._node_jobs: dict[str, list[str]] = {}

    def observe_frame(self, frame: telemetry.FrameView) -> None:
        """The GPUs a node reports, and the job ids its agent read for each (when it reads them)."""
        known = self._known.setdefault(frame.node, set())
        if isinstance(frame, framecols.Frame) and not frame.may_carry("jobs"):
            indexes = frame.readings(_INDEX)
            if indexes is not None:  # no GPU of it names a job: its indexes are all there is to read
                known.update(int(row[0]) for row in indexes)
                return
        for gpu in frame.gpus:
            known.add(gpu.index)
            ids = getattr(gpu, "jobs", None)
            if ids is None:
                continue
            key = (frame.node, gpu.index)
            if ids:
                self._from_frames[key] = tuple(ids)
            else:
                self._from_frames.pop(key, None)

    def forget_node(self, node: str) -> None:
        self._known.pop(node, None)
        for key in [k for k in self._from_frames if k[0] == node]:
            del self._from_frames[key]

    def set_scheduled(self, source: str, placements: Iterable[Placement]) -> None:
        """Replace what ``source`` said last with its new listing."""
        self._scheduled[source] = list(placements)
        self._device = {}
        self._node_jobs = {}
        for listing in self._scheduled.values():
            for p in listing:
                if p.gpus is None:
                    jobs = self._node_jobs.setdefault(p.node, [])
                    if p.job not in jobs:
                        jobs.append(p.job)
                else:
                    for g in p.gpus:
                        self._device.setdefault((p.node, g), p.job)

    def job_of(self, node: str, gpu: int) -> str | None:
        """The job running on ``gpu`` of ``node`` (the first, when a GPU is shared), or None."""
        ids = self._from_frames.get((node, gpu))
        if ids:
            return ids[0]
        job = self._device.get((node, gpu))
        if job is not None:
            return job
        on_node = self._node_jobs.get(node)
        if on_node and len(on_node) == 1:
            return on_node[0]
        return None

    def groups(self) -> dict[str, list[Member]]:
        """Every job's GPUs (of the nodes whose frames this controller sees), sorted."""
        out: dict[str, list[Member]] = {}
        for node in sorted(self._known):
            for gpu in sorted(self._known[node]):
                job = self.job_of(node, gpu)
                if job is not None:
                    out.setdefault(job, []).append((node, gpu))
        return out


_RANGE = re.compile(r"^(.*?)\[([^\]]+)\](.*)$")


def expand_hostlist(expr: str) -> list[str]:
    """Slurm's compressed host list (``gpu[01-03,07],login1``) as names; a malformed part stays as is."""
    out: list[str] = []
    for part in _split_top(expr):
        m = _RANGE.match(part)
        if not m:
            if part:
                out.append(part)
            continue
        head, body, tail = m.groups()
        for piece in body.split(","):
            lo, _, hi = piece.partition("-")
            if hi and lo.isdigit() and hi.isdigit() and int(hi) >= int(lo) and int(hi) - int(lo) < 100_000:
                out += [f"{head}{i:0{len(lo)}d}{tail}" for i in range(int(lo), int(hi) + 1)]
            else:
                out.append(f"{head}{piece}{tail}")
    return out


def _split_top(expr: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in expr:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts]


def placements_from_squeue(jobs: Mapping[str, Mapping[str, Any]]) -> list[Placement]:
    """Running jobs from ``squeue --json`` (``SlurmActuator.jobs()``), one node-level placement per node."""
    out: list[Placement] = []
    for job_id, job in jobs.items():
        state = job.get("job_state")
        states = state if isinstance(state, list) else [state]
        if "RUNNING" not in states:
            continue
        nodes = job.get("nodes")
        if isinstance(nodes, str) and nodes:
            out += [Placement(job=str(job_id), node=n) for n in expand_hostlist(nodes)]
    return out


def placements_from_pods(pods: Sequence[Mapping[str, Any]]) -> list[Placement]:
    """Running pods that ask for GPUs (a pod list's ``items``), by job, on their node."""
    out: list[Placement] = []
    for pod in pods:
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") != "Running" or not _wants_gpus(spec):
            continue
        meta = pod.get("metadata") or {}
        devices = (meta.get("annotations") or {}).get(DEVICES_ANNOTATION)
        gpus: tuple[int, ...] | None = None
        if isinstance(devices, str) and devices.strip():
            try:
                gpus = tuple(int(d) for d in devices.split(","))
            except ValueError:
                gpus = None
        out.append(Placement(job=_job_name(meta), node=str(node), gpus=gpus))
    return out


def _wants_gpus(spec: Mapping[str, Any]) -> bool:
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        for kind in ("limits", "requests"):
            if str((res.get(kind) or {}).get(GPU_RESOURCE, "0")) not in ("0", ""):
                return True
    return False


def _job_name(meta: Mapping[str, Any]) -> str:
    ns = str(meta.get("namespace", "default"))
    labels = meta.get("labels") or {}
    for key in JOB_LABELS:
        if labels.get(key):
            return f"{ns}/{labels[key]}"
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return f"{ns}/{ref.get('name')}"
    return f"{ns}/{meta.get('name')}"
