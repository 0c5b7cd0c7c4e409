"""healer's power limits on one node's GPUs, for the agent's ``CommandExecutor``.

``set_power_limit`` clamps to the GPU's [min, max] and remembers the limit it found, once, so
``restore_power_limit`` returns exactly that limit (the executor saves ``originals`` to disk, so even
after an agent restart). Two of healer's reasons may hold one GPU at once (a hot GPU's incident and its
rack's power budget): each command names its ``holder``, the record keeps one limit per holder, and the
GPU gets the lowest of them; a restore lifts only its holder's (a command without a holder lifts them
all). A limit someone else changed after healer set it is never touched: the record is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import structlog

from healer import errors
from healer.schemas import commands
from healer.telemetry import source

log = structlog.get_logger(__name__)

TOLERANCE_W = 0.5
"""Two limits closer than this are the same limit (NVML works in milliwatts; drivers round)."""


class PowerControl(Protocol):
    def power_limits(self, index: int) -> source.PowerLimits: ...

    def set_power_limit(self, index: int, watts: float) -> None: ...


class PowerLimits:
    """Sets and restores the GPUs' limits through ``power``; ``originals``: healer's record per GPU
    (the limit it found, the limit applied, each holder's limit), persisted by the executor."""

    def __init__(self, power: PowerControl, clock: Callable[[], float]) -> None:
        self.power = power
        self.clock = clock
        self.originals: dict[int, dict[str, Any]] = {}

    def set_limit(self, cmd: commands.Command, index: int) -> commands.PowerChange:
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

    def restore_limit(self, cmd: commands.Command, index: int) -> commands.PowerChange:
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
