"""CommandExecutor: what the agent does with a command from ``healer.cmd.<node>``.

Safety rules, in the order they are checked:
1. a command id seen before gets the same answer again (the controller may retry; nothing runs twice);
2. a command for another node, past its expiry, or with a fencing token older than the newest this
   node has seen is refused with a reason (a deposed leader's late command cannot undo its successor);
   a token *newer* than any seen is persisted only if it is a live lease's token in KV
   ``healer-leases`` (``LiveTokens``, read by the runner): a controller credential used from
   elsewhere cannot send ``fencing_token=1e15`` and lock the real leader out;
3. ``set_power_limit`` clamps to the GPU's [min, max] and remembers the limit it found, once, on disk,
   so ``restore_power_limit`` returns exactly that limit even after an agent restart. Two of healer's
   reasons may hold one GPU at once (a hot GPU's incident and its rack's power budget): each command
   names its ``holder`` (the incident), the record keeps one limit per holder, and the GPU gets the
   lowest of them; a restore lifts only its holder's, so the GPU returns to the limit it had before
   healer only when no holder is left, and to the tighter of the others until then (a command without a
   holder, from an older controller or another tool, lifts them all);
4. ``restore_power_limit`` never touches a limit someone else changed after healer set it;
5. ``reset_gpu`` resets one GPU only while no compute process runs on it (else ``refused``, not
   remembered, so the controller may ask again with the same id once the work is gone), within the
   command's ``timeout_s`` (default ``RESET_TIMEOUT_S``); a reset, once done, is remembered like every
   command, so a retry never resets twice; healer's record of a power limit on that GPU is dropped (a
   reset returns the default limit);
7. ``reboot_node`` is refused unless the agent has a reboot command (``agent.reboot_command``) and while
   compute processes run on any GPU; its answer is remembered and saved to disk *before* the host goes
   down, so the controller's retry after the reboot gets ``applied`` and no second reboot;
6. ``validate`` reads the newest frame's GPUs and the events since ``soak_since`` (``Health``, given by
   the runner) and, with ``dcgm_level`` > 0, runs ``dcgmi diag``; its verdict is ``result.validation``;
   where the agent reads ports itself (``PortControl``) they are read fresh from sysfs, and each port the
   command names must be ACTIVE and LinkUp at its expected rate;
8. ``reset_port`` bounces the link of each port it names, one after the other (``PortControl``:
   agent.link_reset), and waits for it to read ACTIVE again within the command's ``timeout_s``
   (default ``PORT_RESET_TIMEOUT_S``). It is refused while compute processes run on any GPU, and when
   a port is not one sysfs lists (nothing is bounced then; the result is ``failed``, permanent, so the
   ladder moves on to the reboot); a port that does not come back fails it. Once done it is remembered.

The executor is synchronous and shared by the real agent and the simulated fleet, so a simulated node
answers exactly as a real one would. This module checks and dispatches (rules 1 and 2, the record on
disk); the power limits (3, 4) are ``power_limits.PowerLimits``, the recovery commands (5 to 8) the
handlers in ``recovery_commands``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
from collections.abc import Callable
from typing import Any, Protocol

import structlog

from healer.agent import power_limits, recovery_commands, validation
from healer.schemas import commands, events, fabric, telemetry

log = structlog.get_logger(__name__)

RECENT_MAX = 256


@dataclasses.dataclass(frozen=True, slots=True)
class LiveTokens:
    """The fencing tokens of the leases held now (KV ``healer-leases``), or why they could not be read."""

    tokens: frozenset[int]
    error: str = ""


class GpuControl(Protocol):
    """What a reset needs from the source (NvmlSource, SimSource)."""

    def compute_processes(self, index: int) -> list[int]: ...

    def reset_gpu(self, index: int, timeout_s: float) -> str: ...

    def device_info(self, index: int) -> dict[str, str | None]: ...


class PortControl(Protocol):
    """What a port link reset needs (agent.link_reset.LinkResetter reads sysfs and runs the bounce)."""

    def read_ports(self) -> list[fabric.PortSample]: ...

    def reset_port(self, name: str, timeout_s: float) -> commands.PortReset: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Health:
    """What validation reads: the newest frame's GPUs, how many there should be, the events since, and
    the newest frame's RDMA ports (None: not read)."""

    gpus: list[telemetry.GpuSample]
    expected: int | None
    events: list[events.NodeEvent]
    ports: list[fabric.PortSample] | None = None


DcgmRunner = Callable[[int, float | None], validation.DcgmResult | None]


class CommandExecutor:
    def __init__(
        self,
        node: str,
        power: power_limits.PowerControl,
        state_path: pathlib.Path | None,
        clock: Callable[[], float] = time.time,
        gpu_indices: Callable[[], list[int]] | None = None,
        gpu: GpuControl | None = None,
        health: Callable[[float | None], Health] | None = None,
        dcgm: DcgmRunner = validation.run_dcgmi,
        reboot: Callable[[], str] | None = None,
        ports: PortControl | None = None,
    ) -> None:
        self.node = node
        self.power = power
        self.gpu = gpu
        """Reset control; None where the source has none (reset_gpu is refused)."""
        self.health = health
        """The runner's view for validation; None: validate is refused."""
        self.dcgm = dcgm
        self.reboot = reboot
        """Reboots this host (returns at once; the host goes down soon after); None: reboots are off."""
        self.ports = ports
        """Reads and resets the node's RDMA ports; None: reset_port is refused (validation then reads
        the ports of the newest frame)."""
        self.state_path = state_path
        self.clock = clock
        self.gpu_indices = gpu_indices
        self.fencing_token = 0
        self.fencing_refused = 0
        """Commands refused because their new token is no live lease's (or the lease was unreadable)."""
        self.limits = power_limits.PowerLimits(power, lambda: self.clock())
        self.recent: dict[str, dict[str, Any]] = {}
        self._load()

    # -- persistence -------------------------------------------------------------------------------
    def _load(self) -> None:
        if self.state_path is None or not self.state_path.exists():
            return
        try:
            doc = json.loads(self.state_path.read_text())
            self.fencing_token = int(doc.get("fencing_token", 0))
            self.limits.originals = {int(k): v for k, v in doc.get("originals", {}).items()}
            self.recent = dict(doc.get("recent", {}))
        except (OSError, ValueError, TypeError, AttributeError) as e:
            # Refusing to start would leave the GPUs capped forever; start empty and say so loudly.
            log.error("commands.state_unreadable", path=str(self.state_path), error=repr(e))

    def _save(self) -> None:
        if self.state_path is None:
            return
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "fencing_token": self.fencing_token,
            "originals": {str(k): v for k, v in self.originals.items()},
            "recent": self.recent,
        }
        tmp = self.state_path.with_suffix(".tmp")
        with tmp.open("w") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_path)

    # -- the entry point ---------------------------------------------------------------------------
    def needs_lease(self, cmd: commands.Command) -> bool:
        """Whether ``cmd`` carries a token newer than any seen (to be checked against the lease)."""
        return cmd.fencing_token > self.fencing_token and cmd.id not in self.recent

    def execute(self, cmd: commands.Command, live: LiveTokens | None = None) -> commands.CommandResult:
        """``live``: the leases' tokens now, for a command whose token is newer than any seen; None
        where there is no lease to check against (an in-memory bus, the simulated fleet)."""
        bound = log.bind(node=self.node, command_id=cmd.id, action=cmd.action, token=cmd.fencing_token)
        seen = self.recent.get(cmd.id)
        if seen is not None:
            bound.info("commands.repeat")
            return commands.CommandResult.model_validate(seen)
        refusal = self._refusal(cmd)
        if not refusal and live is not None and cmd.fencing_token > self.fencing_token:
            refusal = self._beyond_lease(cmd, live)
            if refusal:
                bound.error("commands.fencing_refused", reason=refusal, seen=self.fencing_token)
                self.fencing_refused += 1
            if refusal and live.error:  # not a verdict on the token: the controller tries again
                return self.result(
                    cmd, commands.ResultStatus.FAILED, f"temporary: {refusal}", [], remember=False
                )
        if refusal:
            bound.warning("commands.refused", reason=refusal)
            return self.result(cmd, commands.ResultStatus.REFUSED, refusal, [], remember=False)
        if cmd.fencing_token > self.fencing_token:
            self.fencing_token = cmd.fencing_token
        handler = recovery_commands.RECOVERY.bound(self).get(cmd.action)
        if handler is not None:
            done: commands.CommandResult = handler(cmd, bound)
            return done
        targets = self.targets(cmd)
        if not targets:
            return self.result(cmd, commands.ResultStatus.REFUSED, "no GPU to act on", [], remember=False)
        if cmd.action in commands.SETS_LIMIT:
            changes = [self.limits.set_limit(cmd, i) for i in targets]
        else:
            changes = [self.limits.restore_limit(cmd, i) for i in targets]
        status = max((c.status for c in changes), key=lambda s: s.rank)
        detail = "; ".join(f"gpu{c.index}: {c.detail}" for c in changes if c.detail)
        result = self.result(cmd, status, detail, changes, remember=True)
        bound.info("commands.executed", status=status, detail=detail)
        return result

    def refuse_undecodable(self, reason: str) -> commands.CommandResult:
        log.warning("commands.undecodable", node=self.node, reason=reason)
        return commands.CommandResult(
            command_id="", node=self.node, status="refused", detail=reason, ts=self.clock()
        )

    def _refusal(self, cmd: commands.Command) -> str:
        now = self.clock()
        if cmd.node != self.node:
            return f"command for node {cmd.node!r} delivered to {self.node!r}"
        if now > cmd.expires_at:
            return f"expired {now - cmd.expires_at:.1f}s ago"
        if cmd.fencing_token < self.fencing_token:
            return (
                f"stale fencing token {cmd.fencing_token} < {self.fencing_token} (a newer leader has spoken)"
            )
        return ""

    @staticmethod
    def _beyond_lease(cmd: commands.Command, live: LiveTokens) -> str:
        if live.error:
            return f"fencing token {cmd.fencing_token} is new and the lease cannot be read: {live.error}"
        if cmd.fencing_token not in live.tokens:
            held = ", ".join(str(t) for t in sorted(live.tokens)) or "none"
            return (
                f"fencing token {cmd.fencing_token} is no lease's in KV healer-leases (held: {held}); "
                "not persisted"
            )
        return ""

    def targets(self, cmd: commands.Command) -> list[int]:
        if cmd.gpu_index is not None:
            return [cmd.gpu_index]
        return list(self.gpu_indices()) if self.gpu_indices else []

    def result(
        self,
        cmd: commands.Command,
        status: commands.ResultStatus,
        detail: str,
        changes: list[commands.PowerChange],
        *,
        remember: bool,
        reset: commands.GpuReset | None = None,
        validation: commands.Validation | None = None,
        port_resets: list[commands.PortReset] | None = None,
    ) -> commands.CommandResult:
        result = commands.CommandResult(
            command_id=cmd.id,
            node=self.node,
            status=status,
            detail=detail,
            gpus=changes,
            reset=reset,
            validation=validation,
            port_resets=port_resets or [],
            ts=self.clock(),
        )
        if remember:
            self.recent[cmd.id] = result.model_dump(mode="json", by_alias=True)
            while len(self.recent) > RECENT_MAX:
                self.recent.pop(next(iter(self.recent)))
        self._save()
        return result

    @property
    def originals(self) -> dict[int, dict[str, Any]]:
        """healer's record of each GPU's limit (``power_limits.PowerLimits.originals``)."""
        return self.limits.originals
