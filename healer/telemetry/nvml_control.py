"""Acting on one GPU through NVML, for ``NvmlSource``: its power limits, its identity, its compute
processes and its reset; and what an NVML error means (``error_classes``, ``init_failed``).

``Control`` is a part of ``NvmlSource`` (a mixin over the same lock, handles and log): each call takes
the source's lock, so it never runs under a frame being sampled. Like the source, it is given the pynvml
module (the real one, or ``tests/fakes/fake_pynvml.py``'s) and never imports it.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

import structlog

from healer import errors
from healer.telemetry import source

if TYPE_CHECKING:
    from healer.telemetry.nvml import _Gpu

PERMANENT_POWER: Final = ("NVMLError_NoPermission", "NVMLError_NotSupported", "NVMLError_InvalidArgument")
"""NVML errors of a power call that no retry mends."""
PERMANENT_INIT: Final = ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded", "NVMLError_NoPermission")
"""NVML errors of ``nvmlInit`` that no retry mends (no driver, no library, no permission)."""


def error_classes(nv: ModuleType, *names: str) -> tuple[type[BaseException], ...]:
    """The NVMLError subclasses of this pynvml by name (a name it lacks is left out)."""
    return tuple(cls for name in names if isinstance(cls := getattr(nv, name, None), type))


def init_failed(nv: ModuleType, e: BaseException) -> errors.HealerError:
    """What a failed nvmlInit means: no driver / library / permission is permanent, the rest may pass."""
    if isinstance(e, error_classes(nv, *PERMANENT_INIT)):
        return errors.PermanentError(f"NVML init failed: {e}")
    return errors.TemporaryError(f"NVML init failed: {e}", delay=5.0)


ResetCommand = Callable[[int, str, float], str]
"""How a GPU is reset: ``(index, uuid, timeout_s) -> message``; raises errors.HealerError if it failed."""


def nvidia_smi_reset(index: int, uuid: str, timeout_s: float) -> str:
    """``nvidia-smi --gpu-reset -i <uuid>`` (NVML has no public reset call; the UUID, not the index,
    because nvidia-smi's numbering need not be NVML's)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise errors.PermanentError("nvidia-smi is not installed: cannot reset a GPU")
    try:
        done = subprocess.run(  # a fixed argv, no shell
            [exe, "--gpu-reset", "-i", uuid], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise errors.TemporaryError(f"nvidia-smi --gpu-reset ran past {timeout_s:g}s", delay=30.0) from e
    text = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        raise errors.PermanentError(f"nvidia-smi --gpu-reset exit {done.returncode}: {text[-500:]}")
    return text[-500:]


class Control:
    """Power limits, identity, compute processes and reset of one of ``NvmlSource``'s GPUs."""

    node: str
    _nv: ModuleType | None
    _gpus: list[_Gpu]
    _lock: threading.Lock
    _log: structlog.typing.FilteringBoundLogger
    _reset_command: ResetCommand

    # -- power -----------------------------------------------------------------------------------------
    def power_limits(self, index: int) -> source.PowerLimits:
        with self._lock:
            nv, gpu = self._device(index)
            try:
                current_mw = nv.nvmlDeviceGetPowerManagementLimit(gpu.handle)
                default_mw = nv.nvmlDeviceGetPowerManagementDefaultLimit(gpu.handle)
                min_mw, max_mw = nv.nvmlDeviceGetPowerManagementLimitConstraints(gpu.handle)
            except nv.NVMLError as e:
                raise self._power_error(nv, e, f"GPU {index}: reading power limits failed") from e
            return source.PowerLimits(
                current_mw / 1000.0, default_mw / 1000.0, min_mw / 1000.0, max_mw / 1000.0
            )

    def set_power_limit(self, index: int, watts: float) -> None:
        with self._lock:
            nv, gpu = self._device(index)
            limit_mw = round(watts * 1000)
            try:
                nv.nvmlDeviceSetPowerManagementLimit(gpu.handle, limit_mw)
            except nv.NVMLError as e:
                raise self._power_error(nv, e, f"GPU {index}: setting power limit to {watts} W failed") from e
            self._log.info(
                "nvml_power_limit_set", gpu_index=index, gpu_uuid=gpu.static.get("uuid"), watts=watts
            )

    # -- identity (for a replacement's evidence) ----------------------------------------------------------
    def device_info(self, index: int) -> dict[str, str | None]:
        """UUID, serial, board part number, VBIOS and driver version; an unreadable one is None."""
        with self._lock:
            nv, gpu = self._device(index)

            def read(fn: str, *args: Any) -> str | None:
                try:
                    value = getattr(nv, fn)(*args)
                except (nv.NVMLError, AttributeError):
                    return None
                return value.decode() if isinstance(value, bytes) else str(value)

            return {
                "uuid": read("nvmlDeviceGetUUID", gpu.handle),
                "serial": read("nvmlDeviceGetSerial", gpu.handle),
                "board_part_number": read("nvmlDeviceGetBoardPartNumber", gpu.handle),
                "vbios_version": read("nvmlDeviceGetVbiosVersion", gpu.handle),
                "driver_version": read("nvmlSystemGetDriverVersion"),
            }

    # -- reset -----------------------------------------------------------------------------------------
    def compute_processes(self, index: int) -> list[int]:
        """The pids of the compute processes on one GPU (nvmlDeviceGetComputeRunningProcesses)."""
        with self._lock:
            nv, gpu = self._device(index)
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(gpu.handle)
            except nv.NVMLError as e:
                raise self._power_error(nv, e, f"GPU {index}: listing compute processes failed") from e
            return sorted(int(p.pid) for p in procs)

    def reset_gpu(self, index: int, timeout_s: float) -> str:
        """Reset one GPU. NVML is shut down for the reset (nvidia-smi refuses a GPU that a monitoring
        session holds) and opened again after it, whatever came of it; sampling waits meanwhile."""
        with self._lock:
            nv, gpu = self._device(index)
            uuid = gpu.static.get("uuid")
            if uuid is None:
                try:
                    uuid = str(nv.nvmlDeviceGetUUID(gpu.handle))
                except nv.NVMLError as e:
                    raise self._power_error(nv, e, f"GPU {index}: reading its UUID failed") from e
            started = time.monotonic()
            nv.nvmlShutdown()
            try:
                message = self._reset_command(index, uuid, timeout_s)
            finally:
                self._reinit(nv, deadline=started + timeout_s + 30.0)
            self._log.warning("nvml_gpu_reset", gpu_index=index, gpu_uuid=uuid, message=message)
            return message

    def _reinit(self, nv: ModuleType, deadline: float) -> None:
        """NVML again after a reset; the handles are new, the cached static readings still hold."""
        while True:
            try:
                nv.nvmlInit()
                break
            except nv.NVMLError as e:
                if time.monotonic() > deadline:
                    self._nv = None
                    raise errors.TemporaryError(f"NVML did not come back after a GPU reset: {e}") from e
                time.sleep(1.0)
        for g in self._gpus:
            try:
                g.handle = nv.nvmlDeviceGetHandleByIndex(g.index)
                g.lost = False
            except nv.NVMLError as e:
                g.handle = None
                self._log.warning("nvml_handle_failed", gpu_index=g.index, error=str(e))

    @staticmethod
    def _power_error(nv: ModuleType, e: BaseException, what: str) -> errors.HealerError:
        if isinstance(e, error_classes(nv, *PERMANENT_POWER)):
            return errors.PermanentError(f"{what}: {e}")
        return errors.TemporaryError(f"{what}: {e}", delay=1.0)

    def _opened(self) -> ModuleType:
        if self._nv is None:
            raise errors.PermanentError("NvmlSource is not open")
        return self._nv

    def _device(self, index: int) -> tuple[ModuleType, _Gpu]:
        nv = self._opened()
        if not 0 <= index < len(self._gpus):
            raise errors.PermanentError(f"no GPU {index} on {self.node} ({len(self._gpus)} GPUs)")
        gpu = self._gpus[index]
        if gpu.handle is None:
            raise errors.TemporaryError(f"GPU {index} has no NVML handle (yet)", delay=5.0)
        return nv, gpu
