"""Run every ``healer doctor`` check in order, each group feeding what it learned to the next.

GPUs first (their fields and events decide which rules are fed), then the host (kernel log, ports,
privileges, tools), then the rule pack (rules left unfed, rungs that would fail), then NATS.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import shutil
from collections.abc import Sequence
from types import ModuleType

import healer
from healer import config
from healer.agent import doctor, doctor_gpu, doctor_host, doctor_nats, doctor_rules


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    node: str
    gpus_expected: int | None = None
    write_test: bool = False
    nvml: ModuleType | None = None
    """The pynvml module; None: the real one."""
    paths: doctor_host.HostPaths = dataclasses.field(default_factory=doctor_host.HostPaths)
    rules_dir: str | None = "rules"
    settings: config.Settings | None = None
    """NATS settings; None: the NATS checks are skipped."""
    monitor_url: str | None = None
    reboot_command: Sequence[str] | None = None


def run(o: Options) -> doctor.Report:
    gpu = doctor_gpu.run(o.node, o.nvml, gpus_expected=o.gpus_expected, write_test=o.write_test)
    host = doctor_host.run(o.paths, fabric_expected=gpu.fabric)
    checks: list[doctor.Check] = [*gpu.checks, *host.checks]
    if gpu.nvml_ok and not gpu.xid_events and not host.kmsg:
        checks.append(
            doctor.Check(
                "xid.sources",
                doctor.Status.FAIL,
                "neither NVML events nor /dev/kmsg: XIDs reach no rule",
                "fix nvml.events or host.kmsg above",
            )
        )
    checks.extend(_pack(o, gpu, host))
    if o.settings is not None:
        checks.extend(asyncio.run(doctor_nats.run(o.settings, o.node, o.monitor_url)))
    else:
        checks.append(doctor.Check("nats.connect", doctor.Status.INFO, "NATS not checked (--no-nats)"))
    return doctor.report(o.node, [checks], version=healer.__version__)


def _pack(o: Options, gpu: doctor_gpu.GpuFacts, host: doctor_host.HostFacts) -> list[doctor.Check]:
    if o.rules_dir is None:
        return [doctor.Check("rules.fed", doctor.Status.INFO, "no rule pack given (--rules DIR)")]
    if not pathlib.Path(o.rules_dir).exists():
        return [
            doctor.Check(
                "rules.fed", doctor.Status.INFO, f"no rule pack at {o.rules_dir}: rules, rungs unchecked",
                "pass --rules DIR (the controller's rules directory or ConfigMap)",
            )
        ]  # fmt: skip
    pack = doctor_rules.load(o.rules_dir)
    if isinstance(pack, str):
        return [
            doctor.Check(
                "rules.fed", doctor.Status.WARN, f"rule pack {o.rules_dir} unreadable: {pack}", "--rules DIR"
            )
        ]
    feeds = doctor_rules.Feeds(
        unsupported=frozenset(gpu.unsupported),
        failing=frozenset(gpu.failing) if gpu.nvml_ok else doctor_gpu.nvml_fields(),
        ports=bool(host.ports),
        xid=gpu.xid_events or host.kmsg,
    )
    writes = [c for c in gpu.checks if c.id == "nvml.power_write" and c.status is not doctor.Status.WARN]
    privileges = doctor_rules.Privileges(
        caps=host.caps,
        root=host.root,
        link_layers=frozenset(p.link_layer for p in host.ports if p.link_layer),
        umad=host.umad,
        reboot_command=o.reboot_command,
        nvidia_smi=shutil.which("nvidia-smi") is not None,
        host_pid=host.host_pid,
        nvml=gpu.nvml_ok,
        power_write=all(c.status is doctor.Status.OK for c in writes) if writes else None,
    )
    rungs = doctor_rules.rung_checks(
        doctor_rules.rungs_used(pack), privileges, netlink=doctor_rules.netlink_allowed()
    )
    return [doctor_rules.rules_check(pack, feeds), *rungs]
