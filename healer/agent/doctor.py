"""``healer doctor``: is this node ready for healer? One verdict per check, with what to do about it.

Each check is a small function that returns ``Check`` values (id, status, one-line summary, the fix,
data); the GPU checks live in ``doctor_gpu``, the host's (kernel log, RDMA ports, privileges, tools) in
``doctor_host``, NATS in ``doctor_nats``, and which rules and ladder rungs the findings leave unfed in
``doctor_rules``. This module holds the vocabulary and the verdict:

- ``ok``: works; ``info``: a fact, nothing to fix (a field the GPU does not have, no RDMA ports);
- ``warn``: healer runs, but something it could use is missing (a rung that would fail, no DCGM);
- ``fail``: something healer needs is missing (no driver, a GPU lost, NATS refuses the credentials).

Exit code: 1 if any check failed, else 2 if any warned, else 0. ``--json`` prints ``Report.to_json()``,
schema ``healer.doctor.v1`` (docs/doctor.md).
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

from healer.schemas import doctor_report

SCHEMA: Final = doctor_report.SCHEMA


class Status(enum.IntEnum):
    """Worst last: the report's verdict is the highest status of its checks."""

    OK = 0
    INFO = 1
    WARN = 2
    FAIL = 3

    @property
    def label(self) -> str:
        return self.name.lower()


EXIT_CODES: Final = {Status.OK: 0, Status.INFO: 0, Status.WARN: 2, Status.FAIL: 1}
"""Worst status -> exit code (documented in docs/doctor.md)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Check:
    id: str
    """Stable name (``nvml.fields``, ``nats.publish_own``); with ``gpu`` it names one GPU's check."""
    status: Status
    summary: str
    fix: str = ""
    """What to do; empty when there is nothing to do."""
    gpu: int | None = None
    data: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def line(self) -> str:
        where = f"[gpu {self.gpu}] " if self.gpu is not None else ""
        fix = f" -> {self.fix}" if self.fix else ""
        return f"{self.status.label.upper():<4}  {self.id:<22} {where}{self.summary}{fix}"

    def to_json(self) -> dict[str, Any]:
        return self.document().model_dump(mode="json")

    def document(self) -> doctor_report.DoctorCheck:
        return doctor_report.DoctorCheck(
            id=self.id, status=self.status.label, gpu=self.gpu, summary=self.summary, fix=self.fix or None,
            data=dict(self.data),
        )  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class Findings:
    """What the checks learned that later checks (rules, rungs) read."""

    unsupported: frozenset[str] = frozenset()
    """GpuSample fields NotSupported on at least one GPU."""
    failing: frozenset[str] = frozenset()
    """GpuSample fields that gave an error on at least one GPU."""
    nvml_ok: bool = False
    xid_events: bool = False
    kmsg: bool = False
    ports: int = 0
    caps: frozenset[str] = frozenset()
    """Effective capabilities of this process (``CAP_SYS_ADMIN`` ...)."""
    root: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    node: str
    checks: tuple[Check, ...]
    ts: float = dataclasses.field(default_factory=time.time)
    version: str = ""

    @property
    def worst(self) -> Status:
        return max((c.status for c in self.checks), default=Status.OK)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.worst]

    def by_id(self, check_id: str) -> list[Check]:
        return [c for c in self.checks if c.id == check_id]

    def lines(self) -> list[str]:
        counts = {s: sum(1 for c in self.checks if c.status is s) for s in Status}
        tail = ", ".join(f"{n} {s.label}" for s, n in counts.items() if n)
        return [c.line() for c in self.checks] + [
            f"healer doctor on {self.node}: {tail}; exit {self.exit_code}"
        ]

    def to_json(self) -> dict[str, Any]:
        """The ``healer.doctor.v1`` document (healer.schemas.doctor), as JSON-ready data."""
        return doctor_report.DoctorReport(
            node=self.node, ts=self.ts, healer_version=self.version, status=self.worst.label,
            exit_code=self.exit_code, checks=[c.document() for c in self.checks],
        ).model_dump(mode="json", by_alias=True)  # fmt: skip


def report(node: str, groups: Iterable[Iterable[Check]], version: str = "") -> Report:
    return Report(node=node, checks=tuple(c for group in groups for c in group), version=version)
