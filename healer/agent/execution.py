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
answers exactly as a real one would.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import time
from collections.abc import Callable
from typing import Any, Final, Protocol

import structlog

from healer import actions, errors
from healer.agent import validation
from healer.schemas import commands, events, fabric, telemetry
from healer.telemetry import source

log = structlog.get_logger(__name__)

TOLERANCE_W = 0.5
"""Two limits closer than this are the same limit (NVML works in milliwatts; drivers round)."""
RECENT_MAX = 256
RESET_TIMEOUT_S = 120.0
"""A reset's time limit when the command names none (nvidia-smi --gpu-reset takes ~10-60 s)."""
PORT_RESET_TIMEOUT_S = 60.0
"""A port link reset's time limit, bounce and wait, when the command names none."""


@dataclasses.dataclass(frozen=True, slots=True)
class LiveTokens:
    """The fencing tokens of the leases held now (KV ``healer-leases``), or why they could not be read."""

    tokens: frozenset[int]
    error: str = ""


class PowerControl(Protocol):
    def power_limits(self, index: int) -> source.PowerLimits: ...

    def set_power_limit(self, index: int, watts: float) -> None: ...


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

RECOVERY: Final = actions.Handlers("agent", actions.AGENT_COMMANDS)
"""The recovery commands (``commands.RECOVERY``), each with its ``@RECOVERY.handler`` method
``(command, bound log) -> result``; the rest set or restore power limits."""


class CommandExecutor:
    def __init__(
        self,
        node: str,
        power: PowerControl,
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
        self.originals: dict[int, dict[str, Any]] = {}
        self.recent: dict[str, dict[str, Any]] = {}
        self._load()

    # -- persistence -------------------------------------------------------------------------------
    def _load(self) -> None:
        if self.state_path is None or not self.state_path.exists():
            return
        try:
            doc = json.loads(self.state_path.read_text())
            self.fencing_token = int(doc.get("fencing_token", 0))
            self.originals = {int(k): v for k, v in doc.get("originals", {}).items()}
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
                return self._result(
                    cmd, commands.ResultStatus.FAILED, f"temporary: {refusal}", [], remember=False
                )
        if refusal:
            bound.warning("commands.refused", reason=refusal)
            return self._result(cmd, commands.ResultStatus.REFUSED, refusal, [], remember=False)
        if cmd.fencing_token > self.fencing_token:
            self.fencing_token = cmd.fencing_token
        recovery = RECOVERY.bound(self).get(cmd.action)
        if recovery is not None:
            done: commands.CommandResult = recovery(cmd, bound)
            return done
        targets = self._targets(cmd)
        if not targets:
            return self._result(cmd, commands.ResultStatus.REFUSED, "no GPU to act on", [], remember=False)
        if cmd.action in commands.SETS_LIMIT:
            changes = [self._set(cmd, i) for i in targets]
        else:
            changes = [self._restore(cmd, i) for i in targets]
        status = max((c.status for c in changes), key=lambda s: s.rank)
        detail = "; ".join(f"gpu{c.index}: {c.detail}" for c in changes if c.detail)
        result = self._result(cmd, status, detail, changes, remember=True)
        bound.info("commands.executed", status=status, detail=detail)
        return result

    @RECOVERY.handler("reset_gpu")
    def _reset(self, cmd: commands.Command, bound: Any) -> commands.CommandResult:
        assert cmd.gpu_index is not None  # the schema requires it
        index = cmd.gpu_index
        if self.gpu is None:
            return self._result(
                cmd,
                commands.ResultStatus.REFUSED,
                "this agent's source cannot reset a GPU",
                [],
                remember=False,
            )
        try:
            pids = self.gpu.compute_processes(index)
        except errors.HealerError as e:
            kind = "temporary" if isinstance(e, errors.TemporaryError) else "permanent"
            report = commands.GpuReset(index=index, status="failed", detail=f"{kind}: {e}")
            return self._result(
                cmd, commands.ResultStatus.FAILED, report.detail, [], remember=False, reset=report
            )
        if pids:
            detail = f"compute processes still run on GPU {index}: pids {', '.join(map(str, pids))}"
            report = commands.GpuReset(index=index, status="refused", pids=pids, detail=detail)
            bound.warning("commands.reset_refused", gpu=index, pids=pids)
            return self._result(cmd, commands.ResultStatus.REFUSED, detail, [], remember=False, reset=report)
        timeout_s = cmd.timeout_s or RESET_TIMEOUT_S
        started = self.clock()
        try:
            message = self.gpu.reset_gpu(index, timeout_s)
        except errors.HealerError as e:
            kind = "temporary" if isinstance(e, errors.TemporaryError) else "permanent"
            report = commands.GpuReset(
                index=index, status="failed", duration_s=self.clock() - started, detail=f"{kind}: {e}"
            )
            bound.error("commands.reset_failed", gpu=index, error=str(e))
            return self._result(
                cmd, commands.ResultStatus.FAILED, report.detail, [], remember=True, reset=report
            )
        if self.originals.pop(index, None) is not None:
            message += "; the reset returned the default power limit (healer's cap is gone)"
        report = commands.GpuReset(
            index=index, status="applied", duration_s=self.clock() - started, detail=message[:1024]
        )
        bound.warning("commands.gpu_reset", gpu=index, duration_s=report.duration_s)
        return self._result(
            cmd, commands.ResultStatus.APPLIED, report.detail, [], remember=True, reset=report
        )

    @RECOVERY.handler("validate")
    def _validate(self, cmd: commands.Command, bound: Any) -> commands.CommandResult:
        if self.health is None:
            return self._result(
                cmd,
                commands.ResultStatus.REFUSED,
                "this agent cannot validate (no health view)",
                [],
                remember=False,
            )
        health = self.health(cmd.soak_since)
        ports = health.ports
        if self.ports is not None:
            try:
                ports = self.ports.read_ports()  # fresh: a port that just came back is not missed
            except OSError as e:
                bound.warning("commands.ports_unreadable", error=str(e))
        dcgm = self.dcgm(cmd.dcgm_level, cmd.timeout_s) if cmd.dcgm_level else None
        report = validation.check(
            health.gpus, health.expected, health.events, dcgm, cmd.dcgm_level, ports=ports,
            expect_ports=cmd.ports if ports is not None else (),
        )  # fmt: skip
        report = report.model_copy(update={"devices": self._devices(health.gpus)})
        failed = [
            f"{c.name}{'' if c.gpu_index is None else f' gpu{c.gpu_index}'}"
            for c in report.checks
            if not c.ok
        ]
        detail = "passed" if report.passed else "failed: " + ", ".join(failed)
        bound.info("commands.validated", passed=report.passed, failed=failed)
        return self._result(
            cmd, commands.ResultStatus.APPLIED, detail[:4096], [], remember=True, validation=report
        )

    @RECOVERY.handler("reboot_node")
    def _reboot(self, cmd: commands.Command, bound: Any) -> commands.CommandResult:
        if self.reboot is None:
            detail = "this agent does not reboot its host (agent.reboot_command is unset)"
            return self._result(cmd, commands.ResultStatus.REFUSED, detail, [], remember=False)
        busy = self._busy(cmd)  # a lost GPU lists nothing: that is what the reboot is for
        if busy:
            detail = "compute processes still run: " + "; ".join(busy)
            return self._result(cmd, commands.ResultStatus.REFUSED, detail, [], remember=False)
        result = self._result(
            cmd, commands.ResultStatus.APPLIED, "reboot started", [], remember=True
        )  # saved before it goes down
        try:
            message = self.reboot()
        except errors.HealerError as e:
            self.recent.pop(cmd.id, None)
            bound.error("commands.reboot_failed", error=str(e))
            return self._result(cmd, commands.ResultStatus.FAILED, f"permanent: {e}", [], remember=False)
        bound.warning("commands.rebooting", message=message)
        return result

    def _busy(self, cmd: commands.Command) -> list[str]:
        """The GPUs compute processes still run on (a lost GPU lists nothing)."""
        busy: list[str] = []
        if self.gpu is not None:
            for index in self._targets(cmd):
                try:
                    pids = self.gpu.compute_processes(index)
                except errors.HealerError:
                    continue
                if pids:
                    busy.append(f"GPU {index}: pids {', '.join(map(str, pids))}")
        return busy

    @RECOVERY.handler("reset_port")
    def _reset_ports(self, cmd: commands.Command, bound: Any) -> commands.CommandResult:
        if self.ports is None:
            detail = (
                "permanent: this agent cannot reset RDMA ports (agent.rdma_ports is off, or a simulated node)"
            )
            return self._result(cmd, commands.ResultStatus.FAILED, detail, [], remember=False)
        try:
            known = {p.name for p in self.ports.read_ports()}
        except OSError as e:
            return self._result(
                cmd, commands.ResultStatus.FAILED, f"temporary: ports unreadable: {e}", [], remember=False
            )
        unknown = [p for p in cmd.ports if p not in known]
        if unknown:
            listed = ", ".join(sorted(known)) or "none"
            detail = f"permanent: no such port {', '.join(unknown)} (sysfs lists {listed}); nothing was reset"
            bound.warning("commands.port_reset_unknown", ports=unknown)
            return self._result(cmd, commands.ResultStatus.FAILED, detail[:4096], [], remember=False)
        busy = self._busy(cmd)
        if busy:
            detail = "compute processes still run: " + "; ".join(busy)
            return self._result(cmd, commands.ResultStatus.REFUSED, detail, [], remember=False)
        timeout_s = cmd.timeout_s or PORT_RESET_TIMEOUT_S
        started = self.clock()
        reports: list[commands.PortReset] = []
        for name in cmd.ports:
            left = max(0.0, timeout_s - (self.clock() - started))  # shared: the controller waits timeout_s
            reports.append(self.ports.reset_port(name, left))
        bad = [r for r in reports if r.status is not commands.ResultStatus.APPLIED]
        status: commands.ResultStatus = commands.ResultStatus.FAILED if bad else commands.ResultStatus.APPLIED
        detail = "; ".join(r.detail for r in (bad or reports))
        if bad and not detail.startswith(("permanent:", "temporary:")):
            detail = f"permanent: {detail}"
        bound.warning(
            "commands.ports_reset", status=status, ports=list(cmd.ports), failed=[r.port for r in bad]
        )
        return self._result(cmd, status, detail[:4096], [], remember=True, port_resets=reports)

    def _devices(self, gpus: list[telemetry.GpuSample]) -> list[commands.Device]:
        """Each answering GPU's identity, for a hardware replacement's evidence."""
        out = []
        for g in sorted(gpus, key=lambda g: g.index):
            try:
                info = self.gpu.device_info(g.index) if self.gpu is not None else {}
            except errors.HealerError:
                info = {}
            out.append(commands.Device(index=g.index, **{**info, "uuid": info.get("uuid") or g.uuid}))
        return out

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

    def _targets(self, cmd: commands.Command) -> list[int]:
        if cmd.gpu_index is not None:
            return [cmd.gpu_index]
        return list(self.gpu_indices()) if self.gpu_indices else []

    def _result(
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

    # -- actions -----------------------------------------------------------------------------------
    def _set(self, cmd: commands.Command, index: int) -> commands.PowerChange:
        try:
            limits = self.power.power_limits(index)
        except errors.HealerError as e:
            return commands.PowerChange(index=index, status="failed", detail=f"cannot read limits: {e}")
        if cmd.watts is not None:
            requested = cmd.watts
        else:
            assert cmd.percent_of_default is not None
            requested = limits.default_w * cmd.percent_of_default / 100.0
        wanted = min(max(requested, limits.min_w), limits.max_w)
        clamped = abs(wanted - requested) > TOLERANCE_W
        record = self._held(index, limits.current_w)
        holds = {**_holds(record), cmd.holder: wanted}
        applied = min(holds.values())
        below = _others(holds, cmd.holder, applied)
        if abs(limits.current_w - applied) <= TOLERANCE_W:
            if record is not None:  # the limit is right already; this holder's hold is kept all the same
                self.originals[index] = {**record, "holds": holds}
            return commands.PowerChange(
                index=index,
                previous_w=limits.current_w,
                requested_w=requested,
                applied_w=limits.current_w,
                clamped=clamped,
                status="already",
                detail=below,
            )
        failed = self._apply(index, applied, limits.current_w, requested)
        if failed is not None:
            return failed
        original = limits.current_w if record is None else record["original_w"]
        self.originals[index] = {
            "original_w": original,
            "applied_w": applied,
            "holds": holds,
            "reason": cmd.reason,
            "at": self.clock(),
        }
        detail = f"clamped to [{limits.min_w:g}, {limits.max_w:g}] W" if clamped else ""
        return commands.PowerChange(
            index=index,
            previous_w=limits.current_w,
            requested_w=requested,
            applied_w=applied,
            clamped=clamped,
            status="applied",
            detail="; ".join(d for d in (detail, below) if d),
        )

    def _held(self, index: int, current_w: float) -> dict[str, Any] | None:
        """healer's record of the GPU's limit, or None; a limit someone changed since healer set it
        drops the record (that limit is now the one to restore)."""
        record = self.originals.get(index)
        if record is not None and abs(current_w - record["applied_w"]) > TOLERANCE_W:
            log.warning(
                "commands.limit_changed_by_other",
                gpu=index,
                healer_set_w=record["applied_w"],
                now_w=current_w,
            )
            return None
        return record

    def _apply(
        self, index: int, watts: float, previous_w: float, requested_w: float
    ) -> commands.PowerChange | None:
        """Set the limit; None when it worked, else the failed change (temporary or permanent)."""
        try:
            self.power.set_power_limit(index, watts)
        except errors.HealerError as e:
            kind = "temporary" if isinstance(e, errors.TemporaryError) else "permanent"
            return commands.PowerChange(
                index=index,
                previous_w=previous_w,
                requested_w=requested_w,
                status="failed",
                detail=f"{kind}: {e}",
            )
        return None

    def _restore(self, cmd: commands.Command, index: int) -> commands.PowerChange:
        record = self.originals.get(index)
        if record is None:
            return commands.PowerChange(index=index, status="already", detail="healer holds no limit here")
        try:
            limits = self.power.power_limits(index)
        except errors.HealerError as e:
            return commands.PowerChange(index=index, status="failed", detail=f"cannot read limits: {e}")
        if abs(limits.current_w - record["applied_w"]) > TOLERANCE_W:
            del self.originals[index]
            return commands.PowerChange(
                index=index,
                previous_w=limits.current_w,
                status="refused",
                detail=f"changed by someone else since healer set {record['applied_w']:g} W; left as is",
            )
        # a holder lifts its own hold and any unnamed one (an older controller's); no holder lifts all
        left = {h: w for h, w in _holds(record).items() if cmd.holder and h and h != cmd.holder}
        if left:
            target = min(left.values())
            detail = _others(left, "", target)
            if abs(limits.current_w - target) <= TOLERANCE_W:
                self.originals[index] = {**record, "holds": left}
                return commands.PowerChange(
                    index=index,
                    previous_w=limits.current_w,
                    applied_w=target,
                    status="already",
                    detail=detail,
                )
            failed = self._apply(index, target, limits.current_w, target)
            if failed is not None:
                return failed
            self.originals[index] = {**record, "holds": left, "applied_w": target, "at": self.clock()}
            return commands.PowerChange(
                index=index, previous_w=limits.current_w, requested_w=target, applied_w=target,
                status="applied", detail=detail,
            )  # fmt: skip
        target = float(record["original_w"])
        failed = self._apply(index, target, limits.current_w, target)
        if failed is not None:
            return failed
        del self.originals[index]
        return commands.PowerChange(
            index=index, previous_w=limits.current_w, requested_w=target, applied_w=target, status="applied"
        )


def _holds(record: dict[str, Any] | None) -> dict[str, float]:
    """Each holder's limit in a record (a record written before holders were named has one, unnamed)."""
    if record is None:
        return {}
    holds = record.get("holds")
    if not isinstance(holds, dict):
        return {"": float(record["applied_w"])}
    return {str(h): float(w) for h, w in holds.items()}


def _others(holds: dict[str, float], holder: str, applied: float) -> str:
    """Why the GPU's limit is not (only) ``holder``'s: the other holders at the limit applied."""
    by = sorted(
        h or "an unnamed holder" for h, w in holds.items() if h != holder and w <= applied + TOLERANCE_W
    )
    return f"held at {applied:g} W by {', '.join(by)}" if by else ""
