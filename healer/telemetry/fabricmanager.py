"""Is NVIDIA Fabric Manager running on this node? Read from ``/proc``, without systemd or D-Bus.

On NVSwitch systems (HGX H100/H200/B200) the ``nv-fabricmanager`` daemon trains the NVLink fabric and
registers every GPU in it; NVML reports each GPU's fabric state, which the agent reads already. A Fabric
Manager that died leaves the GPUs that had registered running, so nothing else looks wrong until the
next GPU reset, driver reload or job that needs the fabric fails (NVSentinel issues #883 and #889: a
Fabric Manager down for days, unnoticed). The agent therefore reports the daemon itself in every frame
(``fabric_manager_up``) where the node has a fabric: ``agent.fabric_manager: auto`` checks once some GPU
reports a fabric state, ``on`` always, ``off`` never.

A check costs one small read: the daemon's pid is remembered and ``/proc/<pid>/comm`` read each frame; a
scan of ``/proc/*/comm`` (or the pid file, where one is configured) finds it again, at most every
``rescan_s`` while it is not running. The process name is the kernel's ``comm``: ``nv-fabricmanager``.
"""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Callable

COMM = "nv-fabricmanager"
"""The daemon's process name (``/proc/<pid>/comm``)."""
RESCAN_S = 10.0


class FabricManagerProbe:
    def __init__(
        self,
        proc_root: str | os.PathLike[str] = "/proc",
        *,
        pid_file: str | os.PathLike[str] | None = None,
        rescan_s: float = RESCAN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.proc = pathlib.Path(proc_root)
        self.pid_file = pathlib.Path(pid_file) if pid_file else None
        self.rescan_s = rescan_s
        self.clock = clock
        self.pid: int | None = None
        self.scans = 0
        self._next_scan = -float("inf")

    def running(self) -> bool:
        """True while a process named ``nv-fabricmanager`` exists."""
        if self.pid is not None and self._is_fm(self.pid):
            return True
        self.pid = None
        now = self.clock()
        if now < self._next_scan:
            return False
        self._next_scan = now + self.rescan_s
        self.scans += 1
        self.pid = self._find()
        return self.pid is not None

    def _find(self) -> int | None:
        if self.pid_file is not None:
            try:
                pid = int(self.pid_file.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pid = None
            if pid is not None and self._is_fm(pid):
                return pid
        try:
            entries = os.listdir(self.proc)
        except OSError:
            return None
        for name in entries:
            if name.isdigit() and self._is_fm(int(name)):
                return int(name)
        return None

    def _is_fm(self, pid: int) -> bool:
        try:
            fd = os.open(self.proc / str(pid) / "comm", os.O_RDONLY)
        except OSError:
            return False
        try:
            return os.read(fd, 64).strip() == COMM.encode()
        except OSError:
            return False
        finally:
            os.close(fd)
