"""Resetting an RDMA port's link for the recovery ladder's ``reset_port`` rung, and reading it come back.

A port that is down or trained down is often fixed by bouncing its link: the link trains again, as a
reboot would make it, without the reboot. How a link is bounced is the operator's setting
(``agent.port_reset_ethernet`` / ``agent.port_reset_infiniband``): argument lists with ``{device}``,
``{port}`` and ``{netdev}`` filled in, run one after the other, never through a shell. The defaults:

- RoCE (``link_layer`` Ethernet): ``ip link set dev <netdev> down``, then ``up``; the netdev is the one
  sysfs names for the port (GID 0's, else the PCI device's ``device/net/``); needs CAP_NET_ADMIN;
- InfiniBand: ``ibportstate -C <device> -P <port> -D 0 <port> reset`` (infiniband-diags: the local HCA
  port by direct route, disabled and enabled again); needs the umad device.

Then the port is read from sysfs (``agent.sysfs_root``) until it is ACTIVE and LinkUp at its expected
rate (the fastest rate among the node's other ACTIVE ports of the same link layer, read before the
bounce; no such peer: any rate), at most until the command's deadline. What came of it is a
``commands.PortReset``; a port sysfs does not list is refused before anything runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence

import structlog

from healer import config, errors
from healer.agent import validation
from healer.schemas import commands, fabric
from healer.telemetry import rdma

log = structlog.get_logger(__name__)

POLL_S = 0.25
"""How often sysfs is read while waiting for the port to come back."""
STEP_TIMEOUT_S = 30.0
"""The most one bounce command may run (``ip link`` and ``ibportstate`` return within a second)."""
_NETDEV = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,31}$")


class LinkResetter:
    """The agent's ``PortControl``: the node's ports read fresh from sysfs, and their link reset."""

    def __init__(
        self,
        root: str | os.PathLike[str] = "/sys",
        *,
        ethernet: Sequence[Sequence[str]] | None = None,
        infiniband: Sequence[Sequence[str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        poll_s: float = POLL_S,
    ) -> None:
        defaults = config.AgentSettings()
        self.reader = rdma.PortReader(root, rescan_s=0.0)
        """Its own reader (the agent's samples in another thread), scanning at every read: a port that
        vanished or appeared is seen at once."""
        self.templates: dict[str, list[list[str]]] = {
            "Ethernet": [list(a) for a in (defaults.port_reset_ethernet if ethernet is None else ethernet)],
            "InfiniBand": [
                list(a) for a in (defaults.port_reset_infiniband if infiniband is None else infiniband)
            ],
        }
        self.clock = clock
        self.sleep = sleep
        self.poll_s = poll_s

    def read_ports(self) -> list[fabric.PortSample]:
        return self.reader.read()

    def reset_port(self, name: str, timeout_s: float) -> commands.PortReset:
        """Bounce ``name``'s link and wait (at most ``timeout_s`` in all) for it to come back."""
        started = self.clock()
        deadline = started + timeout_s
        ports = {p.name: p for p in self.read_ports()}
        port = ports.get(name)
        if port is None:
            return commands.PortReset(port=name, status="refused", detail="no such port in sysfs")
        expected = validation.expected_rate(port, ports.values())

        def report(
            status: commands.ResultStatus, seen: fabric.PortSample | None, detail: str
        ) -> commands.PortReset:
            seen = seen or port
            return commands.PortReset(
                port=name, status=status, link_layer=port.link_layer, state=seen.state,
                phys_state=seen.phys_state, rate_gbps=seen.rate_gbps, expected_rate_gbps=expected,
                duration_s=self.clock() - started, detail=detail[:2048],
            )  # fmt: skip

        try:
            argvs = self._argvs(port)
        except errors.PermanentError as e:
            return report(commands.ResultStatus.REFUSED, None, str(e))
        for argv in argvs:
            try:
                self._run(argv, max(1.0, min(STEP_TIMEOUT_S, deadline - self.clock())))
            except errors.PermanentError as e:
                log.error("link_reset.command_failed", port=name, argv=argv, error=str(e))
                return report(commands.ResultStatus.FAILED, None, f"permanent: {e}")
        log.warning("link_reset.bounced", port=name, link_layer=port.link_layer, commands=len(argvs))
        seen: fabric.PortSample | None = None
        while True:
            seen = next((p for p in self.read_ports() if p.name == name), None)
            why = validation.port_not_up(seen, expected)
            if not why:
                return report(
                    commands.ResultStatus.APPLIED, seen, f"{name} back: {validation.describe(seen)}"
                )
            if self.clock() >= deadline:
                late = f"permanent: {name} did not come back in {timeout_s:.1f}s: {why}"
                return report(commands.ResultStatus.FAILED, seen, late)
            self.sleep(min(self.poll_s, max(0.0, deadline - self.clock())))

    def _argvs(self, port: fabric.PortSample) -> list[list[str]]:
        templates = self.templates.get(port.link_layer or "")
        if templates is None:
            raise errors.PermanentError(f"link layer {port.link_layer!r} is neither Ethernet nor InfiniBand")
        if not templates:
            raise errors.PermanentError(f"{port.link_layer} port resets are turned off (agent.port_reset_*)")
        values = {"device": port.device, "port": str(port.port), "netdev": port.netdev or ""}
        needs_netdev = any("{netdev}" in arg for argv in templates for arg in argv)
        if needs_netdev and not (port.netdev and _NETDEV.match(port.netdev)):
            raise errors.PermanentError(f"{port.name} has no network device in sysfs to bounce")
        out = []
        for argv in templates:
            filled = []
            for arg in argv:
                for key, value in values.items():
                    arg = arg.replace("{" + key + "}", value)
                filled.append(arg)
            out.append(filled)
        return out

    @staticmethod
    def _run(argv: list[str], timeout_s: float) -> None:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise errors.PermanentError(f"{argv[0]}: {e}") from e
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-300:]
            raise errors.PermanentError(f"{' '.join(argv)} exit {done.returncode}: {tail}")
