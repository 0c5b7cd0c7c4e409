"""The agent's /metrics serves the GPUs' readings under dcgm-exporter's names and labels."""

from __future__ import annotations

import pathlib

import prometheus_client
from prometheus_client import parser

from healer.agent import daemon, exposition, gpu_metrics
from healer.bus import subjects
from healer.schemas import dcgm, events, telemetry
from healer.sim import node_source
from tests import conftest

DCGM_EXPORTER_DEFAULTS = {
    # etc/default-counters.csv of NVIDIA's dcgm-exporter: the names its dashboards use.
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
}
NOT_READ_BY_HEALER = {
    # Fields of that default set the agent does not read from NVML (docs/agent.md says so).
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
}


def _frame(gpus: int = 2) -> telemetry.NodeFrame:
    sample = node_source.SimSource("gpu-07", gpus=gpus, seed=5).sample()
    return telemetry.NodeFrame(
        node="gpu-07", ts=1.0, seq=0, boot_id="b", agent_version="t", source="sim", gpus=sample.gpus
    )


def _scrape(registry: prometheus_client.CollectorRegistry) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = prometheus_client.generate_latest(registry).decode()
    return {
        fam.name: [(s.labels, s.value) for s in fam.samples]
        for fam in parser.text_string_to_metric_families(text)
        if fam.name.startswith("DCGM_")
    }


def test_every_reading_is_served_under_its_dcgm_name_with_dcgm_exporter_labels() -> None:
    metrics = exposition.AgentMetrics()
    frame = _frame()
    metrics.gpu.observe(frame)
    got = _scrape(metrics.registry)
    for gpu in frame.gpus:
        (temp,) = [v for labels, v in got["DCGM_FI_DEV_GPU_TEMP"] if labels["gpu"] == str(gpu.index)]
        assert temp == gpu.temp_c
        ((labels, energy),) = [
            (lb, v) for lb, v in got["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] if lb["gpu"] == str(gpu.index)
        ]
        assert gpu.energy_j is not None
        assert energy == gpu.energy_j * 1000  # dcgm-exporter reports mJ
        assert labels == {
            "gpu": str(gpu.index),
            "UUID": gpu.uuid,
            "pci_bus_id": gpu.pci_bus_id,
            "device": f"nvidia{gpu.index}",
            "modelName": gpu.model,
            "Hostname": "gpu-07",
        }
        (free,) = [v for lb, v in got["DCGM_FI_DEV_FB_FREE"] if lb["gpu"] == str(gpu.index)]
        assert gpu.mem_total_mib is not None
        assert gpu.mem_used_mib is not None
        assert free == gpu.mem_total_mib - gpu.mem_used_mib


def test_a_reading_the_gpu_does_not_support_has_no_series() -> None:
    metrics = exposition.AgentMetrics()
    frame = _frame(1)
    gpu = frame.gpus[0].model_copy(update={"mem_temp_c": None})
    metrics.gpu.observe(frame.model_copy(update={"gpus": [gpu]}))
    got = _scrape(metrics.registry)
    assert got["DCGM_FI_DEV_MEMORY_TEMP"] == []
    assert len(got["DCGM_FI_DEV_GPU_TEMP"]) == 1


def test_the_last_xid_of_each_gpu_is_served_as_dcgm_exporter_does() -> None:
    metrics = exposition.AgentMetrics()
    metrics.gpu.observe(_frame())
    metrics.gpu.observe_event(events.new("gpu-07", "xid", gpu_index=1, xid=79, message="fell off the bus"))
    got = dict((lb["gpu"], v) for lb, v in _scrape(metrics.registry)["DCGM_FI_DEV_XID_ERRORS"])
    assert got == {"0": 0.0, "1": 79.0}


def test_jobs_from_the_mapping_directory_label_the_series(tmp_path: pathlib.Path) -> None:
    (tmp_path / "0").write_text("1001\n1002\n")
    (tmp_path / "1").write_text("2001\n")
    (tmp_path / "README").write_text("not a GPU")
    collector = gpu_metrics.GpuCollector(tmp_path)
    registry = prometheus_client.CollectorRegistry()
    registry.register(collector)
    collector.observe(_frame(3))
    got = _scrape(registry)["DCGM_FI_DEV_GPU_UTIL"]
    assert sorted((lb["gpu"], lb["hpc_job"]) for lb, _ in got) == [
        ("0", "1001"),
        ("0", "1002"),
        ("1", "2001"),
        ("2", ""),
    ]


def test_an_unreadable_mapping_directory_leaves_the_job_label_off(tmp_path: pathlib.Path) -> None:
    collector = gpu_metrics.GpuCollector(tmp_path / "missing")
    assert collector.jobs() == {}


def test_the_catalogue_covers_dcgm_exporter_s_defaults_that_healer_reads() -> None:
    exported = {f.name for f in dcgm.EXPORTED}
    assert exported >= DCGM_EXPORTER_DEFAULTS - NOT_READ_BY_HEALER
    assert {f.name for f in dcgm.EXPORTED if f.default} == DCGM_EXPORTER_DEFAULTS - NOT_READ_BY_HEALER
    fields = set(telemetry.GpuSample.model_fields)
    assert {f.source for f in dcgm.EXPORTED} - fields == dcgm.DERIVED


async def test_the_agent_serves_what_it_sampled(tmp_path: pathlib.Path) -> None:
    subj = subjects.Subjects()
    bus = conftest.make_memory_bus(subj)
    agent = daemon.Agent(
        node="n1", source=node_source.SimSource("n1", gpus=2, seed=2), bus=bus, state_dir=tmp_path
    )
    await agent.tick()
    got = _scrape(agent.metrics.registry)
    assert sorted(lb["gpu"] for lb, _ in got["DCGM_FI_DEV_POWER_USAGE"]) == ["0", "1"]
    assert {lb["Hostname"] for lb, _ in got["DCGM_FI_DEV_POWER_USAGE"]} == {"n1"}
    await bus.close()
