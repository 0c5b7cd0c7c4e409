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
The schedulers' listings also say what each job is (``JobInfo``: its Slurm QOS and partition, its
pods' Kubernetes priority class), which the power budgets' priority policy ranks (``info_at``).
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
ASKED_MAX: Final = 100_000
"""At most this many job ids remembered as never listed (``JobIndex.unlisted``); past it they are
forgotten, and each may bring one more listing forward."""
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


@dataclasses.dataclass(frozen=True, slots=True)
class JobInfo:
    """What the scheduler says a job is, as far as its power priority goes (None: not said)."""

    qos: str | None = None
    """Slurm: the job's QOS (reported only with accounting; without it ``squeue`` gives ``""``)."""
    partition: str | None = None
    """Slurm: the job's partition (a pending job may list several, comma-separated)."""
    priority_class: str | None = None
    """Kubernetes: the ``spec.priorityClassName`` of the job's pods."""


class JobIndex:
    def __init__(self) -> None:
        self._from_frames: dict[Member, tuple[str, ...]] = {}
        self._known: dict[str, set[int]] = {}
        self._scheduled: dict[str, list[Placement]] = {}
        """Per source (``slurm``, ``kubernetes``): its last listing."""
        self._device: dict[Member, str] = {}
        self._node_jobs: dict[str, list[str]] = {}
        self._infos: dict[str, dict[str, JobInfo]] = {}
        """Per source: what its last listing said each job is."""
        self._listed: set[str] = set()
        """Every job the last listings describe."""
        self._unlisted: set[str] = set()
        """Job ids the frames named since the last listing that no listing describes (``unlisted``)."""
        self._asked: set[str] = set()
        """Job ids that a listing after they appeared did not describe either: not asked about again."""

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
                for job in ids:
                    if job not in self._listed and job not in self._asked:
                        self._unlisted.add(job)
            else:
                self._from_frames.pop(key, None)

    def forget_node(self, node: str) -> None:
        self._known.pop(node, None)
        for key in [k for k in self._from_frames if k[0] == node]:
            del self._from_frames[key]

    def set_scheduled(
        self, source: str, placements: Iterable[Placement], infos: Mapping[str, JobInfo] | None = None
    ) -> None:
        """Replace what ``source`` said last with its new listing (and what it says each job is)."""
        self._scheduled[source] = list(placements)
        self._infos[source] = dict(infos or {})
        self._listed = {job for listing in self._infos.values() for job in listing}
        if len(self._asked) > ASKED_MAX:
            self._asked = set()
        self._asked |= self._unlisted - self._listed
        self._unlisted = set()
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

    def unlisted(self) -> bool:
        """Whether the frames named a job since the last listing that no listing describes (a job that
        started since: the next listing may be brought forward, ``jobs_unlisted_refresh_s``). An id a
        listing after it did not describe either (the agent's naming is not the scheduler's) is not
        counted again."""
        return bool(self._unlisted)

    def info_of(self, job: str) -> JobInfo | None:
        """What the schedulers' last listings say ``job`` is, or None (not listed)."""
        for infos in self._infos.values():
            info = infos.get(job)
            if info is not None:
                return info
        return None

    def info_at(self, node: str, gpu: int) -> tuple[str, JobInfo] | None:
        """The job on ``gpu`` of ``node`` that a scheduler's listing describes, with what it says the job
        is: the frame's job first (as ``job_of``), else the scheduler's own placement there (a frame's
        job id the scheduler does not list, say one of another naming, does not hide it)."""
        on_node = self._node_jobs.get(node) or []
        candidates = [
            *self._from_frames.get((node, gpu), ()),
            *([job] if (job := self._device.get((node, gpu))) is not None else []),
            *(on_node if len(on_node) == 1 else []),
        ]
        for job in candidates:
            info = self.info_of(job)
            if info is not None:
                return job, info
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


def infos_from_squeue(jobs: Mapping[str, Mapping[str, Any]]) -> dict[str, JobInfo]:
    """What ``squeue --json`` says each running job is: its QOS and partition (Slurm 22.05's fields
    ``qos`` and ``partition``, strings; ``""`` is not said)."""
    out: dict[str, JobInfo] = {}
    for job_id, job in jobs.items():
        state = job.get("job_state")
        if "RUNNING" not in (state if isinstance(state, list) else [state]):
            continue
        qos, partition = job.get("qos"), job.get("partition")
        out[str(job_id)] = JobInfo(
            qos=qos if isinstance(qos, str) and qos else None,
            partition=partition if isinstance(partition, str) and partition else None,
        )
    return out


def infos_from_pods(pods: Sequence[Mapping[str, Any]]) -> dict[str, JobInfo]:
    """What the running GPU pods say each job is (``placements_from_pods``' jobs): the priority class of
    its pods (``spec.priorityClassName``; the first pod listed that names one)."""
    out: dict[str, JobInfo] = {}
    for pod in pods:
        spec = pod.get("spec") or {}
        if not spec.get("nodeName") or (pod.get("status") or {}).get("phase") != "Running":
            continue
        if not _wants_gpus(spec):
            continue
        job = _job_name(pod.get("metadata") or {})
        cls = spec.get("priorityClassName")
        if job not in out or (out[job].priority_class is None and isinstance(cls, str) and cls):
            out[job] = JobInfo(priority_class=cls if isinstance(cls, str) and cls else None)
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
