"""A fake ``pynvml``: stands in for libnvidia-ml seen through nvidia-ml-py, because there is no GPU here.

healer's NVML source and XID watcher take the ``pynvml`` module as a parameter. On a GPU node that is the
real module from the ``nvidia-ml-py`` package, which calls into the driver's libnvidia-ml.so; in tests
and benchmarks it is ``FakeNvml(...).module()``, a real ``types.ModuleType`` whose functions have the
real functions' names and parameter names, whose return values have the real shapes (objects with
``.used``/``.total``, ``.gpu``/``.memory``, ``.busId``, field values with ``.nvmlReturn`` and
``.value.ullVal``, event data with ``.device``/``.eventType``/``.eventData``), and whose ``NVMLError``
hierarchy is built from the ``NVML_ERROR_*`` codes the same way pynvml builds it, so that
``NVMLError(NVML_ERROR_GPU_IS_LOST)`` is an ``NVMLError_GpuIsLost``. Constants carry the values of
nvidia-ml-py 13.615; ``tests/telemetry/test_fake_pynvml.py`` checks names, signatures and values against the
installed real module so the fake cannot drift silently.

State lives on a ``FakeNvml`` object (one per test): per-GPU readings in NVML's own units (mW, mJ,
bytes), functions that answer NotSupported or any other error code, lost GPUs, power limits, and XIDs
injected into every event set that registered for them. ``calls`` counts every function call.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import queue
import string
import threading
import types
from typing import Any

# --- constants (values copied from nvidia-ml-py 13.615.71) ------------------------------------------
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2
NVML_TEMPERATURE_GPU = 0
NVML_NVLINK_MAX_LINKS = 36
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
NVML_VALUE_TYPE_UNSIGNED_SHORT = 6
NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38
NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45
NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52
NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
NVML_GPU_RECOVERY_ACTION_NONE = 0
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
NVML_GPU_FABRIC_STATE_COMPLETED = 3
NVML_GPU_RECOVERY_ACTION_GPU_RESET = 1
NVML_GPU_RECOVERY_ACTION_NODE_REBOOT = 2
NVML_GPU_RECOVERY_ACTION_DRAIN_P2P = 3
NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET = 4
nvmlEventTypeSingleBitEccError = 0x0000000000000001
nvmlEventTypeDoubleBitEccError = 0x0000000000000002
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlEventTypeNone = 0x0000000000000000

CONSTANT_PREFIXES = ("NVML_", "nvmlEventType")


# --- errors, built like pynvml builds them --------------------------------------------------------------
class NVMLError(Exception):
    _valClassMapping: dict[int, type[NVMLError]] = {}
    value: int

    def __new__(typ, value: int) -> NVMLError:
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    _errcode_to_string: dict[int, str] = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }

    def __str__(self) -> str:
        return NVMLError._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return self.value == getattr(other, "value", None)

    __hash__ = None  # type: ignore[assignment]  # like pynvml: __eq__ without __hash__


def _error_classes() -> dict[str, type[NVMLError]]:
    made = {}
    for name, val in sorted(globals().items()):
        if not name.startswith("NVML_ERROR_"):
            continue
        class_name = "NVMLError_" + string.capwords(name.replace("NVML_ERROR_", ""), "_").replace("_", "")

        def gen_new(v: int) -> Any:
            def new(typ: type[NVMLError], *args: Any) -> NVMLError:
                return NVMLError.__new__(typ, v)

            return new

        cls = type(class_name, (NVMLError,), {"__new__": gen_new(val)})
        NVMLError._valClassMapping[val] = cls
        made[class_name] = cls
    return made


ERROR_CLASSES = _error_classes()
globals().update(ERROR_CLASSES)


# --- return types (the real ones are ctypes structures with these field names) -------------------------
NO_INSTANCE = 0xFFFFFFFF
"""gpuInstanceId / computeInstanceId of a process on a GPU without MIG."""


class nvmlFriendlyObject:
    """pynvml's own wrapper for what some calls return (a struct turned into attributes)."""

    def __init__(self, dictionary: dict[str, Any]) -> None:
        for x in dictionary:
            setattr(self, x, dictionary[x])


class c_nvmlDevice_t:
    """A device handle. Real handles are ctypes pointers: compare them by index, not identity."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<fake nvmlDevice {self.index}>"


@dataclasses.dataclass
class c_nvmlMemory_t:
    total: int
    free: int
    used: int


@dataclasses.dataclass
class c_nvmlUtilization_t:
    gpu: int
    memory: int


@dataclasses.dataclass
class nvmlPciInfo_t:
    busId: str
    busIdLegacy: str = ""
    domain: int = 0
    bus: int = 0
    device: int = 0
    pciDeviceId: int = 0x233010DE
    pciSubSystemId: int = 0


@dataclasses.dataclass
class c_nvmlValue_t:
    dVal: float = 0.0
    uiVal: int = 0
    ulVal: int = 0
    ullVal: int = 0
    sllVal: int = 0
    siVal: int = 0
    usVal: int = 0


@dataclasses.dataclass
class c_nvmlFieldValue_t:
    fieldId: int
    scopeId: int = 0
    timestamp: int = 0
    latencyUsec: int = 0
    valueType: int = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    nvmlReturn: int = NVML_SUCCESS
    value: c_nvmlValue_t = dataclasses.field(default_factory=c_nvmlValue_t)


@dataclasses.dataclass
class c_nvmlEventData_t:
    device: c_nvmlDevice_t
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class c_nvmlEventSet_t:
    def __init__(self) -> None:
        self.queue: queue.Queue[c_nvmlEventData_t | int] = queue.Queue()
        self.registered: dict[int, int] = {}
        self.freed = False


class c_nvmlGpuFabricInfo_t(ctypes.Structure):
    """As nvidia-ml-py has it: the caller allocates it and passes ``byref`` to the NVML call."""

    _fields_ = (
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
    )


STRUCTS = (
    c_nvmlDevice_t,
    c_nvmlGpuFabricInfo_t,
    c_nvmlMemory_t,
    c_nvmlUtilization_t,
    nvmlPciInfo_t,
    c_nvmlValue_t,
    c_nvmlFieldValue_t,
    c_nvmlEventData_t,
    c_nvmlEventSet_t,
)


# --- per-GPU state ---------------------------------------------------------------------------------------
def _h100_fields() -> dict[int, int | float]:
    return {
        NVML_FI_DEV_MEMORY_TEMP: 52,
        NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: 0,
        NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: 0,
        NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: 0,
        NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: 0,
        NVML_FI_DEV_NVLINK_LINK_COUNT: 18,
        NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: NVML_GPU_RECOVERY_ACTION_NONE,
    }


@dataclasses.dataclass
class FakeGpu:
    """One GPU in NVML's units. Defaults: an H100 SXM 80GB under load."""

    index: int
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    bus_id: str = ""
    temp_c: int = 61
    slowdown_c: int = 90
    shutdown_c: int = 92
    mem_max_c: int = 95
    power_mw: int = 612_345
    limit_mw: int = 700_000
    default_limit_mw: int = 700_000
    min_limit_mw: int = 200_000
    max_limit_mw: int = 700_000
    energy_mj: int = 123_456_789
    util_gpu: int = 93
    util_mem: int = 57
    mem_total_b: int = 85_520_809_984
    mem_used_b: int = 64_424_509_440
    sm_clock_mhz: int = 1980
    sm_clock_max_mhz: int = 1980
    clocks_event_reasons: int = 0
    ecc: dict[tuple[int, int], int] = dataclasses.field(
        default_factory=lambda: {(e, c): 0 for e in (0, 1) for c in (0, 1)}
    )
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    retired_pages: dict[int, list[int]] = dataclasses.field(default_factory=lambda: {0: [], 1: []})
    retired_pending: int = NVML_FEATURE_DISABLED
    fields: dict[int, int | float] = dataclasses.field(default_factory=_h100_fields)
    field_errors: dict[int, int] = dataclasses.field(default_factory=dict)
    """field id -> NVML_ERROR_* code in that field's nvmlReturn (absent from ``fields``: not supported)"""
    links_up: int = 18
    pcie_gen: int = 5
    pcie_gen_max: int = 5
    pcie_width: int = 16
    pcie_width_max: int = 16
    pcie_replay: int = 0
    supported_events: int = (
        nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | (nvmlEventTypeXidCriticalError)
    )
    unsupported: set[str] = dataclasses.field(
        default_factory=lambda: {
            "nvmlDeviceGetRetiredPages",
            "nvmlDeviceGetRetiredPagesPendingStatus",
        }
    )
    """function names that answer NVML_ERROR_NOT_SUPPORTED for this GPU (Hopper has no page retirement)"""
    errors: dict[str, int] = dataclasses.field(default_factory=dict)
    """function name -> NVML_ERROR_* code it raises for this GPU"""
    lost: bool = False
    fabric_state: int = NVML_GPU_FABRIC_STATE_COMPLETED
    """NVML_GPU_FABRIC_STATE_*; an H100 SXM in an NVSwitch system, registered with the fabric manager"""
    fabric_status: int = NVML_SUCCESS
    """nvmlReturn_t of the fabric registration"""
    serial: str = ""
    board_part_number: str = "692-2G520-0200-000"
    vbios_version: str = "96.00.99.00.01"
    processes: list[int] = dataclasses.field(default_factory=list)
    """pids of the compute processes on this GPU (nvmlDeviceGetComputeRunningProcesses)"""
    resets: int = 0
    persistence_mode: int = NVML_FEATURE_ENABLED
    """nvmlDeviceGetPersistenceMode (nvidia-persistenced keeps the driver loaded)"""

    def __post_init__(self) -> None:
        self.uuid = self.uuid or f"GPU-{self.index:08x}-fake-4a1b-9c2d-{self.index:012x}"
        self.serial = self.serial or f"16523{self.index:08d}"
        self.bus_id = self.bus_id or f"00000000:{0x18 + self.index * 0x10:02X}:00.0"


class FakeNvml:
    """The state behind one fake ``pynvml`` module; ``module()`` is what NvmlSource / XidWatcher take."""

    def __init__(self, gpus: int = 8) -> None:
        self.gpus = [FakeGpu(i) for i in range(gpus)]
        self.calls: collections.Counter[str] = collections.Counter()
        self.init_count = 0
        self.driver_version = "570.133.20"
        self.init_error: int | None = None
        self.wait_error: int | None = None
        """An NVML_ERROR_* code the next nvmlEventSetWait raises (once), e.g. GPU_IS_LOST."""
        self.event_sets: list[c_nvmlEventSet_t] = []
        self._lock = threading.Lock()
        self._module: types.ModuleType | None = None

    # -- test controls -----------------------------------------------------------------------------------
    def module(self) -> types.ModuleType:
        if self._module is None:
            mod = types.ModuleType("pynvml", __doc__)
            for name, value in globals().items():
                if name.startswith(CONSTANT_PREFIXES):
                    setattr(mod, name, value)
            mod.NVMLError = NVMLError  # type: ignore[attr-defined]
            for name, cls in ERROR_CLASSES.items():
                setattr(mod, name, cls)
            for struct in STRUCTS:
                setattr(mod, struct.__name__, struct)
            for name in dir(type(self)):
                if name.startswith("nvml"):
                    setattr(mod, name, getattr(self, name))
            self._module = mod
        return self._module

    def inject_xid(self, index: int, xid: int) -> None:
        """An XID on one GPU: every event set registered for XIDs on it gets it."""
        self._inject(index, nvmlEventTypeXidCriticalError, xid)

    def inject_dbe(self, index: int) -> None:
        """A double-bit ECC error event on one GPU."""
        self._inject(index, nvmlEventTypeDoubleBitEccError, 0)

    def gpu_reset(self, index: int) -> str:
        """What ``nvidia-smi --gpu-reset`` does to this GPU: refused while a process uses it or NVML is
        initialised in this process (the agent must shut NVML down first); otherwise volatile ECC counts
        clear, a pending row remap is applied, the power limit returns to its default, a lost GPU
        stays lost. Returns nvidia-smi's message; raises RuntimeError where it would exit non-zero."""
        gpu = self.gpus[index]
        refused = f"Unable to reset GPU {gpu.bus_id}"
        if gpu.lost:
            raise RuntimeError(f"{refused}: GPU is lost")
        if gpu.processes:
            raise RuntimeError(f"{refused}: in use by another client (pids {gpu.processes})")
        if self.init_count > 0:
            raise RuntimeError(f"{refused}: in use by another client (an NVML session)")
        for key in list(gpu.ecc):
            if key[1] == NVML_VOLATILE_ECC:
                gpu.ecc[key] = 0
        corr, unc, _pending, failure = gpu.remapped_rows
        gpu.remapped_rows = (corr, unc, 0, failure)
        gpu.limit_mw = gpu.default_limit_mw
        gpu.resets += 1
        return f"GPU {gpu.bus_id} was successfully reset."

    def _inject(self, index: int, event_type: int, data: int) -> None:
        for es in self.event_sets:
            if es.registered.get(index, 0) & event_type and not es.freed:
                es.queue.put(c_nvmlEventData_t(c_nvmlDevice_t(index), event_type, data))

    def _gpu(self, handle: c_nvmlDevice_t, fn: str) -> FakeGpu:
        self.calls[fn] += 1
        if self.init_count <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.errors:
            raise NVMLError(gpu.errors[fn])
        if fn in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu

    # -- the pynvml API (names and parameter names as in nvidia-ml-py) ------------------------------------
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1
        if self.init_count <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self.init_count -= 1

    def nvmlDeviceGetCount(self) -> int:
        self.calls["nvmlDeviceGetCount"] += 1
        if self.init_count <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> c_nvmlDevice_t:
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return c_nvmlDevice_t(index)

    def nvmlDeviceGetIndex(self, handle: c_nvmlDevice_t) -> int:
        return self._gpu(handle, "nvmlDeviceGetIndex").index

    def nvmlDeviceGetName(self, handle: c_nvmlDevice_t) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetSerial(self, handle: c_nvmlDevice_t) -> str:
        return self._gpu(handle, "nvmlDeviceGetSerial").serial

    def nvmlDeviceGetBoardPartNumber(self, handle: c_nvmlDevice_t) -> str:
        return self._gpu(handle, "nvmlDeviceGetBoardPartNumber").board_part_number

    def nvmlDeviceGetVbiosVersion(self, handle: c_nvmlDevice_t) -> str:
        return self._gpu(handle, "nvmlDeviceGetVbiosVersion").vbios_version

    def nvmlSystemGetDriverVersion(self) -> str:
        self.calls["nvmlSystemGetDriverVersion"] += 1
        if self.init_count <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return self.driver_version

    def nvmlDeviceGetUUID(self, handle: c_nvmlDevice_t) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetPciInfo(self, handle: c_nvmlDevice_t) -> nvmlPciInfo_t:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
        domain, bus, rest = gpu.bus_id.split(":")  # NVML's "00000000:3B:00.0"
        device = int(rest.split(".")[0], 16)
        return nvmlPciInfo_t(
            busId=gpu.bus_id,
            busIdLegacy=gpu.bus_id[4:],
            domain=int(domain, 16),
            bus=int(bus, 16),
            device=device,
        )

    def nvmlDeviceGetTemperature(self, handle: c_nvmlDevice_t, sensor: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temp_c

    def nvmlDeviceGetTemperatureV(self, handle: c_nvmlDevice_t, sensor: int, version: int = 0x100000C) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperatureV")
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temp_c

    def nvmlDeviceGetTemperatureThreshold(self, handle: c_nvmlDevice_t, threshold: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperatureThreshold")
        thresholds = {
            NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: gpu.shutdown_c,
            NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: gpu.slowdown_c,
            NVML_TEMPERATURE_THRESHOLD_MEM_MAX: gpu.mem_max_c,
        }
        if threshold not in thresholds:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return thresholds[threshold]

    def nvmlDeviceGetPowerUsage(self, handle: c_nvmlDevice_t) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetPowerManagementLimit(self, handle: c_nvmlDevice_t) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerManagementLimit").limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: c_nvmlDevice_t) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerManagementDefaultLimit").default_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: c_nvmlDevice_t) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetPowerManagementLimitConstraints")
        return [gpu.min_limit_mw, gpu.max_limit_mw]

    def nvmlDeviceSetPowerManagementLimit(self, handle: c_nvmlDevice_t, limit: int) -> None:
        gpu = self._gpu(handle, "nvmlDeviceSetPowerManagementLimit")
        if not isinstance(limit, int) or not gpu.min_limit_mw <= limit <= gpu.max_limit_mw:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu.limit_mw = limit

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: c_nvmlDevice_t) -> int:
        return self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetUtilizationRates(self, handle: c_nvmlDevice_t) -> c_nvmlUtilization_t:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        return c_nvmlUtilization_t(gpu=gpu.util_gpu, memory=gpu.util_mem)

    def nvmlDeviceGetMemoryInfo(self, handle: c_nvmlDevice_t, version: int | None = None) -> c_nvmlMemory_t:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        return c_nvmlMemory_t(
            total=gpu.mem_total_b, free=gpu.mem_total_b - gpu.mem_used_b, used=gpu.mem_used_b
        )

    def nvmlDeviceGetClockInfo(self, handle: c_nvmlDevice_t, type: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetClockInfo")
        return gpu.sm_clock_mhz if type == NVML_CLOCK_SM else 2619

    def nvmlDeviceGetMaxClockInfo(self, handle: c_nvmlDevice_t, type: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetMaxClockInfo")
        return gpu.sm_clock_max_mhz if type == NVML_CLOCK_SM else 2619

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: c_nvmlDevice_t) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").clocks_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: c_nvmlDevice_t) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").clocks_event_reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: c_nvmlDevice_t, errorType: int, counterType: int) -> int:
        return self._gpu(handle, "nvmlDeviceGetTotalEccErrors").ecc[(errorType, counterType)]

    def nvmlDeviceGetRemappedRows(self, device: c_nvmlDevice_t) -> tuple[int, int, int, int]:
        return self._gpu(device, "nvmlDeviceGetRemappedRows").remapped_rows

    def nvmlDeviceGetComputeRunningProcesses(self, handle: c_nvmlDevice_t) -> list[nvmlFriendlyObject]:
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        ids = {"gpuInstanceId": NO_INSTANCE, "computeInstanceId": NO_INSTANCE}
        return [nvmlFriendlyObject({"pid": pid, "usedGpuMemory": 1 << 30, **ids}) for pid in gpu.processes]

    def nvmlDeviceGetRetiredPages(self, device: c_nvmlDevice_t, sourceFilter: int) -> list[int]:
        return list(self._gpu(device, "nvmlDeviceGetRetiredPages").retired_pages[sourceFilter])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: c_nvmlDevice_t) -> int:
        return self._gpu(device, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pending

    def nvmlDeviceGetFieldValues(
        self, handle: c_nvmlDevice_t, fieldIds: list[int]
    ) -> list[c_nvmlFieldValue_t]:
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        out = []
        for field_id in fieldIds:
            fv = c_nvmlFieldValue_t(fieldId=field_id)
            if field_id in gpu.field_errors:
                fv.nvmlReturn = gpu.field_errors[field_id]
            elif field_id not in gpu.fields:
                fv.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
            else:
                value = gpu.fields[field_id]
                if isinstance(value, float):
                    fv.valueType, fv.value.dVal = NVML_VALUE_TYPE_DOUBLE, value
                elif field_id in (NVML_FI_DEV_NVLINK_LINK_COUNT, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION):
                    fv.valueType, fv.value.uiVal = NVML_VALUE_TYPE_UNSIGNED_INT, value
                elif field_id == NVML_FI_DEV_MEMORY_TEMP:
                    fv.valueType, fv.value.siVal = NVML_VALUE_TYPE_SIGNED_INT, value
                else:
                    fv.valueType, fv.value.ullVal = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, value
            out.append(fv)
        return out

    def nvmlDeviceGetNvLinkState(self, device: c_nvmlDevice_t, link: int) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetNvLinkState")
        if link >= int(gpu.fields.get(NVML_FI_DEV_NVLINK_LINK_COUNT, 0)):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return NVML_FEATURE_ENABLED if link < gpu.links_up else NVML_FEATURE_DISABLED

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: c_nvmlDevice_t) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: c_nvmlDevice_t) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: c_nvmlDevice_t) -> int:
        return self._gpu(handle, "nvmlDeviceGetCurrPcieLinkWidth").pcie_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: c_nvmlDevice_t) -> int:
        return self._gpu(handle, "nvmlDeviceGetMaxPcieLinkWidth").pcie_width_max

    def nvmlDeviceGetPcieReplayCounter(self, handle: c_nvmlDevice_t) -> int:
        return self._gpu(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replay

    def nvmlDeviceGetPersistenceMode(self, handle: c_nvmlDevice_t) -> int:
        return self._gpu(handle, "nvmlDeviceGetPersistenceMode").persistence_mode

    def nvmlDeviceGetGpuFabricInfo(self, device: c_nvmlDevice_t, gpuFabricInfo: Any) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetGpuFabricInfo")
        info = getattr(gpuFabricInfo, "_obj", gpuFabricInfo)  # ctypes.byref(struct), as real callers pass
        info.state, info.status = gpu.fabric_state, gpu.fabric_status
        return NVML_SUCCESS

    # -- events ------------------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> c_nvmlEventSet_t:
        self.calls["nvmlEventSetCreate"] += 1
        es = c_nvmlEventSet_t()
        with self._lock:
            self.event_sets.append(es)
        return es

    def nvmlDeviceGetSupportedEventTypes(self, handle: c_nvmlDevice_t) -> int:
        return self._gpu(handle, "nvmlDeviceGetSupportedEventTypes").supported_events

    def nvmlDeviceRegisterEvents(
        self, handle: c_nvmlDevice_t, eventTypes: int, eventSet: c_nvmlEventSet_t
    ) -> None:
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        if eventTypes & ~gpu.supported_events:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        eventSet.registered[gpu.index] = eventSet.registered.get(gpu.index, 0) | eventTypes

    def nvmlEventSetWait_v2(self, eventSet: c_nvmlEventSet_t, timeoutms: int) -> c_nvmlEventData_t:
        self.calls["nvmlEventSetWait_v2"] += 1
        if eventSet.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if self.wait_error is not None:
            code, self.wait_error = self.wait_error, None
            raise NVMLError(code)
        try:
            item = eventSet.queue.get(timeout=timeoutms / 1000.0)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None
        if isinstance(item, int):
            raise NVMLError(item)
        return item

    def nvmlEventSetWait(self, eventSet: c_nvmlEventSet_t, timeoutms: int) -> c_nvmlEventData_t:
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet: c_nvmlEventSet_t) -> None:
        self.calls["nvmlEventSetFree"] += 1
        eventSet.freed = True
