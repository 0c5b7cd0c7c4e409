"""The agent's GPU readings on ``/metrics`` under dcgm-exporter's names and labels, so the dashboards and
alert rules a site already has for dcgm-exporter work without running it beside healer.

Every scrape renders the newest frame the agent sampled (no second NVML read): one series per GPU and
DCGM field (``healer.schemas.dcgm.EXPORTED``), labelled as dcgm-exporter labels them: ``gpu`` (index),
``UUID``, ``pci_bus_id``, ``device`` (``nvidia<index>``), ``modelName`` and ``Hostname``, plus ``hpc_job``
when the scheduler says which job runs on the GPU. That comes the way dcgm-exporter's
``--hpc-job-mapping-dir`` gets it: a directory with one file per GPU index holding the job ids on that
GPU, one per line, written by a Slurm prolog and removed by the epilog (docs/agent.md); a GPU shared by
two jobs has one series per job, as there.

A reading the GPU does not support (``None``) has no series, as dcgm-exporter leaves out blank fields.
All series are gauges: dcgm-exporter declares some fields as counters yet names them without the
``_total`` suffix that prometheus_client appends to counters, and the names are what dashboards and
rules match on (PromQL's ``rate`` reads gauges the same way).
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import structlog
from prometheus_client import core as prom_core
from prometheus_client import registry as prom_registry

from healer.schemas import dcgm, events, telemetry

log = structlog.get_logger(__name__)
LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")


class GpuCollector(prom_registry.Collector):
    def __init__(self, job_map_dir: str | pathlib.Path | None = None) -> None:
        self.job_map_dir = pathlib.Path(job_map_dir) if job_map_dir else None
        self._frame: telemetry.NodeFrame | None = None
        self._xid: dict[int, int] = {}
        self._job_map_failed = False

    def observe(self, frame: telemetry.NodeFrame) -> None:
        """The newest frame; the next scrape serves it."""
        self._frame = frame

    def observe_event(self, event: events.NodeEvent) -> None:
        if event.kind == "xid" and event.xid is not None and event.gpu_index is not None:
            self._xid[event.gpu_index] = event.xid

    def jobs(self) -> dict[int, list[str]]:
        """GPU index → job ids from the mapping directory; unreadable entries are skipped (logged once)."""
        if self.job_map_dir is None:
            return {}
        out: dict[int, list[str]] = {}
        try:
            entries = list(self.job_map_dir.iterdir())
        except OSError as e:
            if not self._job_map_failed:
                log.warning("agent.job_map_unreadable", path=str(self.job_map_dir), error=str(e))
            self._job_map_failed = True
            return {}
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                ids = [line.strip() for line in entry.read_text().splitlines() if line.strip()]
            except OSError:
                continue  # the epilog removed it between listing and reading
            if ids:
                out[int(entry.name)] = ids
        return out

    def _value(self, gpu: telemetry.GpuSample, source: str) -> float | None:
        if source == "mem_free_mib":
            if gpu.mem_total_mib is None or gpu.mem_used_mib is None:
                return None
            return gpu.mem_total_mib - gpu.mem_used_mib
        if source == "xid_last":
            return float(self._xid.get(gpu.index, 0))
        value = getattr(gpu, source)
        return None if value is None else float(value)

    def collect(self) -> Iterator[prom_core.Metric]:
        frame = self._frame
        if frame is None:
            return
        jobs = self.jobs()
        names = (*LABELS, "hpc_job") if jobs else LABELS
        rows: list[tuple[telemetry.GpuSample, list[list[str]]]] = []
        for gpu in frame.gpus:
            base = [
                str(gpu.index),
                gpu.uuid or "",
                gpu.pci_bus_id or "",
                f"nvidia{gpu.index}",
                gpu.model or "",
                frame.node,
            ]
            label_sets = [[*base, job] for job in jobs.get(gpu.index, [""])] if jobs else [base]
            rows.append((gpu, label_sets))
        for field in dcgm.EXPORTED:
            family = prom_core.GaugeMetricFamily(field.name, field.help, labels=names)
            for gpu, label_sets in rows:
                value = self._value(gpu, field.source)
                if value is None:
                    continue
                for labels in label_sets:
                    family.add_metric(labels, value * field.scale)
            yield family
