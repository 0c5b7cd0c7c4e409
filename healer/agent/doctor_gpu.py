"""``healer doctor``'s GPU checks, all through the agent's own NVML code path (NvmlSource, XidWatcher).

Nothing here calls NVML around the source: the library and driver are what ``NvmlSource.open`` finds,
each GpuSample field is what one ``sample()`` read through its ``_read`` choke point (``read_state`` says
which reads were NotSupported or failed, ``nvml.READS`` which fields each read fills), event
registration is ``XidWatcher.start`` then ``stop`` (no wait for an event), and the power write test is
``set_power_limit`` / ``power_limits``, as the agent's command path uses them. The ``pynvml`` module is a
parameter, as everywhere: the real one on a node, ``tests/fakes/fake_pynvml.py`` in tests.
"""

from __future__ import annotations

import dataclasses
import shutil
from types import ModuleType
from typing import Any, Final

from healer import errors
from healer.agent import doctor
from healer.schemas import telemetry
from healer.telemetry import nvml, source, xid

NOT_NVML: Final = frozenset({"index", "jobs"})
"""GpuSample fields that do not come from NVML (the job map fills ``jobs``)."""
WRITE_STEP_W: Final = 10.0
"""How far below the current limit ``--write-test`` sets it."""


@dataclasses.dataclass(slots=True)
class GpuFacts:
    checks: list[doctor.Check] = dataclasses.field(default_factory=list)
    nvml_ok: bool = False
    unsupported: set[str] = dataclasses.field(default_factory=set)
    failing: set[str] = dataclasses.field(default_factory=set)
    xid_events: bool = False
    fabric: bool = False
    """Some GPU reports a fabric state: an NVSwitch system, where Fabric Manager must run."""


def nvml_fields() -> frozenset[str]:
    """Every GpuSample field NVML fills."""
    return frozenset(f for f in telemetry.GpuSample.model_fields if f not in NOT_NVML)


def fields_of(key: str) -> tuple[str, ...]:
    """The GpuSample fields one ``_read`` key fills."""
    fields = nvml.READS.get(key.split("[", 1)[0], (key.split("[", 1)[0],))
    return (
        tuple(f for f in telemetry.GpuSample.model_fields if f not in NOT_NVML)
        if fields == ("*",)
        else fields
    )


def run(node: str, nv: ModuleType | None, *, gpus_expected: int | None, write_test: bool) -> GpuFacts:
    facts = GpuFacts()
    try:
        module = nv if nv is not None else nvml.load_pynvml()
    except errors.HealerError as e:
        facts.checks.append(
            doctor.Check("nvml.library", doctor.Status.FAIL, str(e), "pip install nvidia-ml-py")
        )
        return facts
    src = nvml.NvmlSource(node, gpus_expected=gpus_expected, nvml=module)
    try:
        src.open()
    except errors.HealerError as e:
        cause = type(e.__cause__).__name__ if e.__cause__ is not None else type(e).__name__
        facts.checks.append(
            doctor.Check("nvml.library", doctor.Status.FAIL, str(e), _init_fix(cause), data={"error": cause})
        )
        return facts
    try:
        facts.nvml_ok = True
        found = int(module.nvmlDeviceGetCount())
        driver = _driver_version(src, found)
        facts.checks.append(
            doctor.Check(
                "nvml.library",
                doctor.Status.OK,
                f"NVML loaded, driver {driver}",
                data={"driver_version": driver},
            )
        )
        facts.checks.append(_count(found, gpus_expected))
        sample = src.sample()
        _fields(src, sample, found, facts)
        facts.checks.extend(_events(node, module, found, facts))
        facts.checks.extend(_power(src, sample, write_test))
        facts.checks.extend(_reset(src, module, sample))
    finally:
        src.close()
    return facts


def _driver_version(src: nvml.NvmlSource, found: int) -> str | None:
    """The driver version, asked through the first GPU that has a handle (a lost GPU 0 has none)."""
    for index in range(found):
        try:
            return src.device_info(index).get("driver_version")
        except errors.HealerError:
            continue
    return None


def _init_fix(error: str) -> str:
    """What to do about a failed nvmlInit, by its NVMLError class."""
    if error == "NVMLError_NoPermission":
        return "run the agent as root (or give it the /dev/nvidia* devices)"
    if error == "NVMLError_LibRmVersionMismatch":
        return "driver and library versions differ (a driver update without a reboot?): reboot the node"
    return "install and load the NVIDIA driver; in a container, use the NVIDIA container runtime"


def _count(found: int, expected: int | None) -> doctor.Check:
    data = {"found": found, "expected": expected}
    if expected is None:
        return doctor.Check(
            "nvml.gpus", doctor.Status.OK, f"{found} GPUs found", "pass --gpus-expected N to check", data=data
        )
    if found < expected:
        return doctor.Check(
            "nvml.gpus",
            doctor.Status.FAIL,
            f"{found} GPUs found, {expected} expected",
            "a GPU is off the bus or its driver failed: nvidia-smi, dmesg (XID 79), reseat or replace",
            data=data,
        )
    if found > expected:
        return doctor.Check(
            "nvml.gpus",
            doctor.Status.WARN,
            f"{found} GPUs found, only {expected} expected",
            "set agent.gpus_expected to the node's real count",
            data=data,
        )
    return doctor.Check("nvml.gpus", doctor.Status.OK, f"{found} GPUs found, as expected", data=data)


def _fields(src: nvml.NvmlSource, sample: source.Sample, found: int, facts: GpuFacts) -> None:
    lost = {e.gpu_index for e in sample.events if e.kind == "gpu_lost"}
    by_index = {g.index: g for g in sample.gpus}
    for i in range(found):
        gpu = by_index.get(i)
        if gpu is None:
            why = "is lost (NVML GpuIsLost)" if i in lost else "gave no NVML handle"
            facts.checks.append(
                doctor.Check(
                    "nvml.fields",
                    doctor.Status.FAIL,
                    f"GPU {why}",
                    "nvidia-smi; reset or reboot the node",
                    gpu=i,
                )
            )
            continue
        unsupported_keys, failing_keys = src.read_state(i)
        unsupported = {f for k in unsupported_keys for f in fields_of(k)}
        failing = {f for k in failing_keys for f in fields_of(k)}
        values = gpu.model_dump()
        states: dict[str, str] = {}
        for name in telemetry.GpuSample.model_fields:
            if name in NOT_NVML:
                continue
            if values[name] is not None:
                states[name] = "supported"
            elif name in failing:
                states[name] = "error"
            elif name in unsupported:
                states[name] = "not_supported"
            else:
                states[name] = "null"
        errs = [e.message for e in sample.events if e.kind == "nvml_error" and e.gpu_index == i]
        bad = sorted(n for n, s in states.items() if s == "error")
        missing = sorted(n for n, s in states.items() if s == "not_supported")
        facts.unsupported.update(missing)
        facts.failing.update(bad)
        data: dict[str, Any] = {"uuid": gpu.uuid, "model": gpu.model, "fields": states, "errors": errs}
        if bad:
            check = doctor.Check(
                "nvml.fields",
                doctor.Status.FAIL,
                f"{len(bad)} fields failed: {', '.join(bad)}",
                "see data.errors; NoPermission: run as root; other codes: check the driver",
                gpu=i,
                data=data,
            )
        elif missing:
            check = doctor.Check(
                "nvml.fields",
                doctor.Status.INFO,
                f"{len(missing)} fields NotSupported (null): {', '.join(missing)}",
                gpu=i,
                data=data,
            )
        else:
            check = doctor.Check(
                "nvml.fields", doctor.Status.OK, f"all fields read ({gpu.model})", gpu=i, data=data
            )
        facts.checks.append(check)
        facts.fabric = facts.fabric or gpu.fabric_state is not None


def _events(node: str, module: ModuleType, found: int, facts: GpuFacts) -> list[doctor.Check]:
    watcher = xid.XidWatcher(node, module, wait_ms=50)
    try:
        watcher.start(lambda _event: None)
        watching = watcher.watching
    except errors.HealerError as e:
        return [
            doctor.Check(
                "nvml.events",
                doctor.Status.WARN,
                f"XID/ECC event registration failed: {e}",
                "XIDs then come from /dev/kmsg alone; outside a container, as root, NVML events work",
            )
        ]
    finally:
        watcher.stop()
    facts.xid_events = bool(watching)
    missed = sorted(set(range(found)) - set(watching))
    data = {"registered": watching, "not_registered": missed}
    if missed:
        return [
            doctor.Check(
                "nvml.events",
                doctor.Status.WARN,
                f"GPUs {missed} refused XID/ECC event registration",
                "XIDs of those GPUs come from /dev/kmsg alone (see the agent log xid_watch_gpu_skipped)",
                data=data,
            )
        ]
    return [
        doctor.Check(
            "nvml.events", doctor.Status.OK, f"XID/ECC events registered on {len(watching)} GPUs", data=data
        )
    ]


def _power(src: nvml.NvmlSource, sample: source.Sample, write_test: bool) -> list[doctor.Check]:
    out: list[doctor.Check] = []
    for gpu in sample.gpus:
        i = gpu.index
        try:
            limits = src.power_limits(i)
        except errors.HealerError as e:
            out.append(
                doctor.Check(
                    "nvml.power", doctor.Status.FAIL, str(e), "the power_limit action needs these", gpu=i
                )
            )
            continue
        data = dataclasses.asdict(limits)
        if not write_test:
            out.append(
                doctor.Check(
                    "nvml.power", doctor.Status.OK, f"limit {limits.current_w:g} W readable", gpu=i, data=data
                )
            )
            continue
        out.append(_write_test(src, i, limits, data))
    return out


def _write_test(
    src: nvml.NvmlSource, i: int, limits: source.PowerLimits, data: dict[str, Any]
) -> doctor.Check:
    target = limits.current_w - WRITE_STEP_W
    if target < limits.min_w:
        return doctor.Check(
            "nvml.power_write",
            doctor.Status.WARN,
            f"limit {limits.current_w:g} W is within {WRITE_STEP_W:g} W of the minimum: write test skipped",
            gpu=i,
            data=data,
        )
    try:
        src.set_power_limit(i, target)
    except errors.HealerError as e:
        return doctor.Check(
            "nvml.power_write",
            doctor.Status.FAIL,
            f"cannot set the power limit: {e}",
            "run as root with CAP_SYS_ADMIN (deploy/systemd, the DaemonSet): the power_limit action needs it",
            gpu=i,
            data=data,
        )
    try:
        written: float | None = src.power_limits(i).current_w
    except errors.HealerError:
        written = None
    try:
        src.set_power_limit(i, limits.current_w)
        restored = src.power_limits(i).current_w
    except errors.HealerError as e:
        return doctor.Check(
            "nvml.power_write", doctor.Status.FAIL,
            f"set {target:g} W but could not restore {limits.current_w:g} W: {e}",
            f"restore it by hand: nvidia-smi -i {i} -pl {limits.current_w:g}", gpu=i, data=data,
        )  # fmt: skip
    data = {**data, "target_w": target, "read_back_w": written, "restored_w": restored}
    if written is None or abs(written - target) > 0.5 or abs(restored - limits.current_w) > 0.5:
        return doctor.Check(
            "nvml.power_write",
            doctor.Status.FAIL,
            f"set {target:g} W read back {written} W, restored {restored:g} W",
            "the driver did not apply the limit: check nvidia-smi -q -d POWER",
            gpu=i,
            data=data,
        )
    return doctor.Check(
        "nvml.power_write",
        doctor.Status.OK,
        f"set {target:g} W, read back, restored {restored:g} W",
        gpu=i,
        data=data,
    )


def _reset(src: nvml.NvmlSource, module: ModuleType, sample: source.Sample) -> list[doctor.Check]:
    smi = shutil.which("nvidia-smi")
    out: list[doctor.Check] = []
    for gpu in sample.gpus:
        i = gpu.index
        persistence = _persistence(module, i)
        try:
            pids: list[int] | None = src.compute_processes(i)
        except errors.HealerError:
            pids = None
        data = {"persistence_mode": persistence, "processes": pids, "nvidia_smi": smi}
        if smi is None:
            status, summary, fix = (
                doctor.Status.WARN,
                "no nvidia-smi: reset_gpu cannot run",
                "install nvidia-utils",
            )
        elif pids:
            status, summary, fix = (
                doctor.Status.INFO,
                f"reset waits for pids {pids} (refused while they run)",
                "",
            )
        else:
            status, summary, fix = doctor.Status.OK, "a reset could run now (no compute processes)", ""
        if persistence is False:
            status = max(status, doctor.Status.WARN)
            summary += "; persistence mode off"
            fix = fix or "enable nvidia-persistenced (the driver unloads between clients otherwise)"
        out.append(doctor.Check("nvml.reset", status, summary, fix, gpu=i, data=data))
    return out


def _persistence(module: ModuleType, index: int) -> bool | None:
    fn = getattr(module, "nvmlDeviceGetPersistenceMode", None)
    if fn is None:
        return None
    try:
        return bool(
            fn(module.nvmlDeviceGetHandleByIndex(index)) == getattr(module, "NVML_FEATURE_ENABLED", 1)
        )
    except module.NVMLError:
        return None
