"""Validation before a node returns to service: the agent's own checks of its GPUs, plus DCGM's.

``check`` is pure: the GPUs of the newest frame, the XIDs that arrived since the rung finished and,
where DCGM is installed, the parsed ``dcgmi diag`` report in; a ``commands.Validation`` out. A node passes
when every expected GPU is present, none has a pending or failed row remap, volatile double-bit ECC is 0,
no XID (or lost GPU) arrived during the soak, the readings are sane, every RDMA port the agent reads is
ACTIVE (unless disabled), each port a link reset bounced is ACTIVE and LinkUp at its expected rate
(``expected_rate``: its fastest same-layer peer), and ``dcgmi diag -r N`` passed.

``run_dcgmi`` runs ``dcgmi diag -r N -j`` with a time limit and reads either JSON shape DCGM writes:
3.x (``"DCGM GPU Diagnostic": {"test_categories": [{"tests": [{"name", "results": [{"status"}]}]}]}``,
statuses ``Pass``/``Fail``/``Warn``/``Skip``) and 4.x (``"tests"`` at the top level, lowercase statuses).
Only ``fail`` fails; ``warn`` is reported in the detail. No ``dcgmi`` on PATH: the check says so and passes
(the issue: "when DCGM is installed").
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from healer.schemas import commands, events, fabric, telemetry

DCGM_TIMEOUT_S = {1: 120.0, 2: 600.0, 3: 1800.0, 4: 7200.0}
"""How long ``dcgmi diag -r N`` may run (level 1 takes about a minute, 3 about half an hour)."""
TEMP_MAX_C = 105.0
"""A reading above this (or at/above the GPU's shutdown threshold) is not sane for an idle GPU."""


@dataclasses.dataclass(frozen=True, slots=True)
class DcgmResult:
    passed: bool
    failures: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    error: str = ""


def check(
    gpus: Sequence[telemetry.GpuSample],
    expected: int | None,
    recent: Sequence[events.NodeEvent],
    dcgm: DcgmResult | None,
    dcgm_level: int = 0,
    *,
    ports: Sequence[fabric.PortSample] | None = None,
    expect_ports: Sequence[str] = (),
) -> commands.Validation:
    """``recent``: the events that arrived during the soak (already filtered by receive time); ``ports``:
    the node's RDMA ports (None: not read, no check). Every port an operator has not disabled
    (physical state 3) must be ACTIVE, as the fabric rules (rules/fabric.yaml) expect; each port named
    in ``expect_ports`` (a port link reset's) must be there, ACTIVE and LinkUp at its expected rate."""
    checks: list[commands.Check] = []
    present = {g.index for g in gpus}
    if expected is not None:
        missing = sorted(set(range(expected)) - present)
        detail = f"missing GPU {', '.join(map(str, missing))} of {expected}" if missing else ""
        checks.append(commands.Check(name="gpus_present", ok=not missing, detail=detail))
    for g in sorted(gpus, key=lambda g: g.index):
        checks += _gpu_checks(g)
    if ports is not None:
        down = [p.name for p in ports if p.phys_state != 3 and p.state != fabric.ACTIVE]
        detail = f"not ACTIVE: {', '.join(down)}" if down else f"{len(ports)} ports"
        checks.append(commands.Check(name="rdma_ports_active", ok=not down, detail=detail))
        by_name = {p.name: p for p in ports}
        for name in expect_ports:
            port = by_name.get(name)
            why = port_not_up(port, expected_rate(port, ports) if port is not None else None)
            detail = f"{name}: {why}" if why else f"{name}: {describe(port)}"
            checks.append(commands.Check(name="rdma_port_up", ok=not why, detail=detail[:2048]))
    bad = [e for e in recent if e.kind in ("xid", "gpu_lost")]
    detail = "; ".join(f"{e.kind} {e.xid or ''} gpu {e.gpu_index}".replace("  ", " ") for e in bad[:8])
    checks.append(commands.Check(name="quiet_soak", ok=not bad, detail=detail))
    if dcgm_level:
        if dcgm is None:
            checks.append(commands.Check(name="dcgm_diag", ok=True, detail="dcgmi is not installed; skipped"))
        else:
            detail = dcgm.error or "; ".join(dcgm.failures + tuple(f"warn: {w}" for w in dcgm.warnings))
            checks.append(commands.Check(name="dcgm_diag", ok=dcgm.passed, detail=detail[:2048]))
    return commands.Validation(
        passed=all(c.ok for c in checks), checks=checks, dcgm_level=dcgm_level, dcgm_ran=dcgm is not None
    )


def expected_rate(port: fabric.PortSample, ports: Iterable[fabric.PortSample]) -> float | None:
    """The rate ``port`` should run at: the fastest of the node's other ACTIVE, LinkUp ports of the
    same link layer (the peers rules/fabric.yaml's rate rule compares with); None without such a peer."""
    rates = [
        p.rate_gbps
        for p in ports
        if p.name != port.name and p.link_layer == port.link_layer and p.state == fabric.ACTIVE
        and p.phys_state == fabric.LINK_UP and p.rate_gbps is not None
    ]  # fmt: skip
    return max(rates) if rates else None


def port_not_up(port: fabric.PortSample | None, expected_gbps: float | None) -> str:
    """Why ``port`` is not back (not there, not ACTIVE, not LinkUp, slower than expected); "" when it is."""
    if port is None:
        return "gone from sysfs"
    if port.state != fabric.ACTIVE or port.phys_state != fabric.LINK_UP:
        return f"not up: {describe(port)}"
    if expected_gbps is not None and (port.rate_gbps is None or port.rate_gbps < expected_gbps):
        return f"at {port.rate_gbps} Gb/s, expected {expected_gbps:g} Gb/s"
    return ""


def describe(port: fabric.PortSample | None) -> str:
    """``ACTIVE LinkUp 400 Gb/s``, as ibstat says it."""
    if port is None:
        return "gone"
    state = fabric.PORT_STATES.get(port.state, str(port.state)) if port.state is not None else "?"
    phys = (
        fabric.PHYS_STATES.get(port.phys_state, str(port.phys_state)) if port.phys_state is not None else "?"
    )
    rate = f"{port.rate_gbps:g} Gb/s" if port.rate_gbps is not None else "rate ?"
    return f"{state} {phys} {rate}"


def _gpu_checks(g: telemetry.GpuSample) -> Iterator[commands.Check]:
    i = g.index
    yield commands.Check(name="row_remap_pending", gpu_index=i, ok=g.row_remap_pending is not True)
    yield commands.Check(name="row_remap_failure", gpu_index=i, ok=g.row_remap_failure is not True)
    dbe = g.ecc_dbe_volatile
    yield commands.Check(
        name="ecc_dbe_volatile_zero",
        gpu_index=i,
        ok=not dbe,
        detail=f"{dbe} volatile double-bit ECC errors" if dbe else "",
    )
    why = []
    limit = min(TEMP_MAX_C, g.shutdown_temp_c) if g.shutdown_temp_c else TEMP_MAX_C
    if g.temp_c is None or not 0.0 < g.temp_c < limit:
        why.append(f"temp_c {g.temp_c}")
    if g.power_w is not None and g.power_w < 0:
        why.append(f"power_w {g.power_w}")
    if g.mem_total_mib is not None and g.mem_total_mib <= 0:
        why.append(f"mem_total_mib {g.mem_total_mib}")
    yield commands.Check(name="readings_sane", gpu_index=i, ok=not why, detail=", ".join(why))


def run_dcgmi(level: int, timeout_s: float | None = None, exe: str = "dcgmi") -> DcgmResult | None:
    """``dcgmi diag -r level -j``; None when dcgmi is not installed."""
    path = shutil.which(exe)
    if path is None:
        return None
    limit = timeout_s if timeout_s is not None else DCGM_TIMEOUT_S.get(level, 600.0)
    try:
        done = subprocess.run(  # a fixed argv, no shell
            [path, "diag", "-r", str(level), "-j"], capture_output=True, text=True, timeout=limit, check=False
        )
    except subprocess.TimeoutExpired:
        return DcgmResult(False, error=f"dcgmi diag -r {level} ran past {limit:g}s")
    except OSError as e:
        return DcgmResult(False, error=f"dcgmi could not run: {e}")
    result = parse_dcgmi(done.stdout)
    if done.returncode != 0 and result.passed:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        return DcgmResult(False, result.failures, result.warnings, f"dcgmi exit {done.returncode}: {tail[0]}")
    return result


def parse_dcgmi(stdout: str) -> DcgmResult:
    """The verdict in ``dcgmi diag -j`` output (3.x or 4.x shape; text before the JSON is ignored)."""
    start = stdout.find("{")
    if start < 0:
        return DcgmResult(False, error="dcgmi printed no JSON report")
    try:
        doc = json.loads(stdout[start:])
    except json.JSONDecodeError as e:
        return DcgmResult(False, error=f"dcgmi report is not JSON: {e}")
    tests = list(_tests(doc))
    if not tests:
        return DcgmResult(False, error="dcgmi report has no tests")
    failures: list[str] = []
    warnings: list[str] = []
    for name, result in tests:
        status = str(result.get("status", "")).lower()
        gpu = result.get("gpu_id", result.get("gpu_ids", result.get("entity_id", "")))
        where = f"{name} (gpu {gpu})" if gpu != "" else name
        raw = result.get("warnings", [])
        notes = [str(w.get("warning", w)) if isinstance(w, dict) else str(w) for w in raw]
        text = f"{where}: {'; '.join(notes)}" if notes else where
        if status == "fail":
            failures.append(text)
        elif status == "warn":
            warnings.append(text)
    return DcgmResult(not failures, tuple(failures), tuple(warnings))


def _tests(doc: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    if not isinstance(doc, dict):
        return
    body = doc.get("DCGM GPU Diagnostic") or doc.get("DCGM Diagnostic") or {}
    groups = [t for cat in body.get("test_categories", []) for t in cat.get("tests", [])]
    groups += list(doc.get("tests", [])) + list(body.get("tests", []))
    for test in groups:
        for result in test.get("results", []):
            if isinstance(result, dict):
                yield str(test.get("name", "?")), result
