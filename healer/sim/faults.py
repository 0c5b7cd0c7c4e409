"""What can go wrong with a simulated GPU, and the ground truth written for every injected fault.

Fail-slow kinds (``clock_limit``, ``nvlink_degraded``, ``pcie_downtrain`` with a ``slowdown``,
``port_congestion``, ``job_slowdown``) slow a GPU's compute or communication; the fleet makes every GPU
of its job wait for the slowest rank (``Fleet.wait``), as a synchronous job does.

Each fault kind has a scope (one GPU or the whole node), documented parameters with defaults, what it
does to the fleet arrays when it starts, on every step while it lasts, and when it ends, and the
moment its signature first becomes visible in telemetry or events (``visible_at``). The kind names are
the labels detection is scored against: they are stable, listed in ``KINDS`` and in docs/simulator.md.

``injector.Injector`` starts them on a fleet at their time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal

from healer import errors
from healer.sim import hca, physics, profiles

Scope = Literal["gpu", "node"]


@dataclasses.dataclass(slots=True)
class Fault:
    kind: str
    node: int
    gpu: int | None
    start: float
    params: dict[str, float]
    id: str = ""
    started: bool = False

    @property
    def end(self) -> float | None:
        duration = self.params.get("duration_s", 0.0)
        return self.start + duration if duration > 0 else None

    @property
    def visible_at(self) -> float:
        return KINDS[self.kind].visible(self)

    def truth(self, node_names: Sequence[str]) -> dict[str, Any]:
        """The ground-truth record (one JSON line)."""
        return {
            "id": self.id,
            "node": node_names[self.node],
            "gpu": self.gpu,
            "kind": self.kind,
            "start": round(self.start, 3),
            "visible_at": round(self.visible_at, 3),
            "end": None if self.end is None else round(self.end, 3),
            "params": dict(self.params),
        }


Action = Callable[[physics.Fleet, Fault], None]
Tick = Callable[[physics.Fleet, Fault, float], None]


def _nothing(fl: physics.Fleet, f: Fault) -> None:
    return None


def no_tick(fl: physics.Fleet, f: Fault, t: float) -> None:
    return None


def _at_start(f: Fault) -> float:
    return f.start


@dataclasses.dataclass(frozen=True, slots=True)
class Kind:
    scope: Scope
    defaults: Mapping[str, float]
    start: Action = _nothing
    tick: Tick = no_tick
    stop: Action = _nothing
    visible: Callable[[Fault], float] = _at_start
    description: str = ""


def _g(f: Fault) -> int:
    assert f.gpu is not None
    return f.gpu


def _ramp(f: Fault, t: float) -> float:
    return min(1.0, max(0.0, (t - f.start) / max(f.params["ramp_s"], 1e-9)))


def _xid(xid: int, message: str, *, crash: bool = False, recovery: int | None = None) -> Action:
    def start(fl: physics.Fleet, f: Fault) -> None:
        fl.emit_event(f.node, "xid", gpu=f.gpu, xid=xid, message=f"Xid {xid}: {message}")
        if recovery is not None and f.gpu is not None:
            fl.recovery[f.node, f.gpu] = recovery
        if crash:
            fl.work.crash(f.node, fl.t)

    return start


def _chain(*actions: Action) -> Action:
    def run(fl: physics.Fleet, f: Fault) -> None:
        for action in actions:
            action(fl, f)

    return run


def _count(*names: str) -> Action:
    def start(fl: physics.Fleet, f: Fault) -> None:
        for name in names:
            fl.counters[name][f.node, _g(f)] += 1

    return start


def _cooling_tick(fl: physics.Fleet, f: Fault, t: float) -> None:
    fl.cool_factor[f.node, _g(f)] = 1.0 - (1.0 - f.params["final_efficiency"]) * _ramp(f, t)


def _inlet_tick(fl: physics.Fleet, f: Fault, t: float) -> None:
    fl.inlet_delta[f.node] = f.params["delta_c"] * _ramp(f, t)


def _inlet_stop(fl: physics.Fleet, f: Fault) -> None:
    fl.inlet_delta[f.node] = 0.0


def _set_rate(attr: str, param: str) -> tuple[Action, Action]:
    def start(fl: physics.Fleet, f: Fault) -> None:
        getattr(fl, attr)[f.node, _g(f)] = f.params[param]

    def stop(fl: physics.Fleet, f: Fault) -> None:
        getattr(fl, attr)[f.node, _g(f)] = 0.0

    return start, stop


def _nvlink_crc_tick(fl: physics.Fleet, f: Fault, t: float) -> None:
    fl.nvlink_crc_rate[f.node, _g(f)] = f.params["peak_rate_per_s"] * _ramp(f, t)


def _nvlink_down(fl: physics.Fleet, f: Fault) -> None:
    n, g = f.node, _g(f)
    fl.nvlink_up[n, g] = max(0, int(fl.nvlink_up[n, g]) - int(f.params["links"]))
    fl.counters["nvlink_recovery_errors"][n, g] += 1


def _pcie_downtrain(fl: physics.Fleet, f: Fault) -> None:
    n, g = f.node, _g(f)
    if f.params["gen"] > 0:
        fl.pcie_gen[n, g] = min(int(f.params["gen"]), int(fl.pcie_gen_max[n, g]))
    if f.params["width"] > 0:
        fl.pcie_width[n, g] = min(int(f.params["width"]), int(fl.pcie_width_max[n, g]))


def _clock_limit(on: bool) -> Action:
    def run(fl: physics.Fleet, f: Fault) -> None:
        fl.clock_cap[f.node, _g(f)] = 1.0 - f.params["drop"] if on else 1.0

    return run


def _slow_while(down: Callable[[physics.Fleet, int, int], bool]) -> Tick:
    """A tick: the GPU communicates ``slowdown`` slower while its link is ``down`` (a reset or reboot
    that retrains the link ends it)."""

    def tick(fl: physics.Fleet, f: Fault, t: float) -> None:
        n, g = f.node, _g(f)
        fl.comm_speed[n, g] = 1.0 - f.params["slowdown"] if down(fl, n, g) else 1.0

    return tick


def _pcie_down(fl: physics.Fleet, n: int, g: int) -> bool:
    return bool(fl.pcie_gen[n, g] < fl.pcie_gen_max[n, g] or fl.pcie_width[n, g] < fl.pcie_width_max[n, g])


def _nvlink_degraded(fl: physics.Fleet, f: Fault) -> None:
    n, g = f.node, _g(f)
    fl.nvlink_up[n, g] = max(0, int(fl.nvlink_up[n, g]) - int(f.params["links"]))


def _node_slow(fl: physics.Fleet, f: Fault, t: float) -> None:
    fl.comm_speed[f.node, :] = 1.0 - f.params["slowdown"]


def _node_fast(fl: physics.Fleet, f: Fault) -> None:
    fl.comm_speed[f.node, :] = 1.0


def _congestion(on: bool) -> Action:
    def run(fl: physics.Fleet, f: Fault) -> None:
        p, port = _ports(fl, f)
        p.wait_rate[f.node, port] = f.params["wait_per_s"] if on else hca.WAIT_PER_S
        if not on:
            _node_fast(fl, f)

    return run


def _fell_off(fl: physics.Fleet, f: Fault) -> None:
    fl.present[f.node, _g(f)] = False
    fl.emit_event(f.node, "gpu_lost", gpu=f.gpu, message="GPU is lost (NVML_ERROR_GPU_IS_LOST)")


def _remap(pending: bool = False, failure: bool = False) -> Action:
    def start(fl: physics.Fleet, f: Fault) -> None:
        if pending:
            fl.remap_pending[f.node, _g(f)] = True
        if failure:
            fl.remap_failure[f.node, _g(f)] = True

    return start


def _silent_start(fl: physics.Fleet, f: Fault) -> None:
    fl.silent[f.node] = True


def _silent_stop(fl: physics.Fleet, f: Fault) -> None:
    fl.restart_agent(f.node)


def _brake(on: bool) -> Action:
    def run(fl: physics.Fleet, f: Fault) -> None:
        fl.brake[f.node, :] = on

    return run


def _ports(fl: physics.Fleet, f: Fault) -> tuple[Any, int]:
    """The fleet's ports and the fault's port index (``port`` parameter)."""
    if fl.ports is None:
        raise errors.PermanentError(f"{f.kind}: the fleet has no RDMA ports (set the scenario's ports)")
    return fl.ports, int(f.params["port"]) % fl.ports.ports


def _port_flap(fl: physics.Fleet, f: Fault) -> None:
    p, port = _ports(fl, f)
    p.flap(f.node, port, fl.t, f.params["down_s"])


def _port_downtrain(fl: physics.Fleet, f: Fault) -> None:
    p, port = _ports(fl, f)
    p.downtrain(f.node, port, f.params["rate_gbps"])


def _port_symbols(on: bool) -> Action:
    def run(fl: physics.Fleet, f: Fault) -> None:
        p, port = _ports(fl, f)
        p.symbol_burst(f.node, port, f.params["rate_per_s"] if on else 0.0)

    return run


def _hca_missing(fl: physics.Fleet, f: Fault) -> None:
    p, port = _ports(fl, f)
    p.hca_missing(f.node, port)


_sbe_start, _sbe_stop = _set_rate("sbe_rate", "rate_per_s")
_replay_start, _replay_stop = _set_rate("pcie_replay_rate", "rate_per_s")

KINDS: Final[dict[str, Kind]] = {
    "cooling_degradation": Kind(
        "gpu",
        {"final_efficiency": 0.5, "ramp_s": 7200.0},
        tick=_cooling_tick,
        visible=lambda f: (
            f.start + f.params["ramp_s"] * min(1.0, 0.1 / max(1e-9, 1.0 - f.params["final_efficiency"]))
        ),
        description="cooling efficiency falls linearly to final_efficiency over ramp_s; visible once "
        "10 % is lost (about 4-5 °C too hot for the power drawn at training load)",
    ),
    "inlet_failure": Kind(
        "node",
        {"delta_c": 20.0, "ramp_s": 120.0, "duration_s": 0.0},
        tick=_inlet_tick,
        stop=_inlet_stop,
        visible=lambda f: f.start + f.params["ramp_s"] * min(1.0, 5.0 / max(f.params["delta_c"], 1e-9)),
        description="node inlet air (fan or CRAC failure) rises by delta_c over ramp_s; visible once the "
        "inlet is 5 °C up",
    ),
    "ecc_sbe_storm": Kind(
        "gpu",
        {"rate_per_s": 20.0, "duration_s": 1800.0},
        start=_sbe_start,
        stop=_sbe_stop,
        description="single-bit ECC errors at rate_per_s (volatile and aggregate counters)",
    ),
    "ecc_dbe": Kind(
        "gpu",
        {},
        start=_chain(
            _count("ecc_dbe_volatile", "ecc_dbe_aggregate", "remapped_rows_uncorrectable"),
            _remap(pending=True),
            _xid(48, "DBE (Double Bit Error) ECC Error", crash=True, recovery=profiles.RECOVERY_GPU_RESET),
        ),
        description="one double-bit error: XID 48, DBE counters +1, a row remap pending until reset",
    ),
    "row_remap_pending": Kind(
        "gpu",
        {},
        start=_chain(
            _count("remapped_rows_correctable"),
            _remap(pending=True),
            _xid(63, "Row remapping event: pending", recovery=profiles.RECOVERY_GPU_RESET),
        ),
        description="XID 63: a row remap recorded and pending until the GPU is reset",
    ),
    "row_remap_failure": Kind(
        "gpu",
        {},
        start=_chain(
            _remap(failure=True),
            _xid(64, "Row remapping failure", crash=True, recovery=profiles.RECOVERY_DRAIN_AND_RESET),
        ),
        description="XID 64: a row could not be remapped (the GPU needs replacing)",
    ),
    "nvlink_crc_rising": Kind(
        "gpu",
        {"peak_rate_per_s": 500.0, "ramp_s": 1800.0},
        tick=_nvlink_crc_tick,
        visible=lambda f: (
            f.start
            + min(
                f.params["ramp_s"],
                math.sqrt(2.0 * f.params["ramp_s"] / max(f.params["peak_rate_per_s"], 1e-9)),
            )
        ),
        description="NVLink CRC flit errors (and replays at 1/10, CRC data errors at 1/100) rising "
        "linearly to peak_rate_per_s over ramp_s; visible at the expected first error",
    ),
    "nvlink_down": Kind(
        "gpu",
        {"links": 1.0},
        start=_chain(_nvlink_down, _xid(74, "NVLink: link down", crash=True)),
        description="XID 74: `links` NVLinks go down (nvlink_links_up drops, recovery errors +1)",
    ),
    "pcie_downtrain": Kind(
        "gpu",
        {"gen": 3.0, "width": 8.0, "slowdown": 0.0},
        start=_pcie_downtrain,
        tick=_slow_while(_pcie_down),
        description="the PCIe link trains below its maximum (gen and width; 0 leaves one unchanged); "
        "with slowdown > 0 the GPU communicates that much slower while the link is down, and its "
        "whole job waits for it (fail-slow)",
    ),
    "pcie_replay_storm": Kind(
        "gpu",
        {"rate_per_s": 5.0, "duration_s": 0.0},
        start=_replay_start,
        stop=_replay_stop,
        visible=lambda f: f.start + 1.0 / max(f.params["rate_per_s"], 1e-9),
        description="PCIe replay counter rising at rate_per_s",
    ),
    "fell_off_bus": Kind(
        "gpu",
        {},
        start=_chain(_xid(79, "GPU has fallen off the bus", crash=True), _fell_off),
        description="XID 79 and gpu_lost: the GPU disappears from frames until the node reboots",
    ),
    "gsp_timeout": Kind(
        "gpu",
        {},
        start=_xid(119, "Timeout waiting for RPC from GSP", crash=True, recovery=profiles.RECOVERY_GPU_RESET),
        description="XID 119: the GPU System Processor stopped answering; recovery action: reset",
    ),
    "uncontained_ecc": Kind(
        "gpu",
        {},
        start=_chain(
            _count("ecc_dbe_volatile", "ecc_dbe_aggregate"),
            _xid(95, "Uncontained ECC error", crash=True, recovery=profiles.RECOVERY_DRAIN_AND_RESET),
        ),
        description="XID 95: an uncontained ECC error (DBE +1, every process on the GPU killed)",
    ),
    "node_silent": Kind(
        "node",
        {"duration_s": 0.0},
        start=_silent_start,
        stop=_silent_stop,
        description="the agent dies: no frames, events or command replies; with duration_s it comes "
        "back with a new boot_id and an agent_start event",
    ),
    "power_brake": Kind(
        "node",
        {"duration_s": 600.0},
        start=_brake(True),
        stop=_brake(False),
        description="hardware power brake on every GPU of the node: clocks and power collapse",
    ),
    "clock_limit": Kind(
        "gpu",
        {"drop": 0.15, "duration_s": 0.0},
        start=_clock_limit(True),
        stop=_clock_limit(False),
        description="fail-slow: a bad power stage holds the GPU's SM clock `drop` (0.1-0.2) below its "
        "maximum under load, with the HW slowdown reason and the dynamic power of the lower clock "
        "(its cube); the GPU's job runs at its speed and the healthy peers wait at lower power; a "
        "GPU reset clears it",
    ),
    "nvlink_degraded": Kind(
        "gpu",
        {"links": 1.0, "slowdown": 0.1},
        start=_nvlink_degraded,
        tick=_slow_while(lambda fl, n, g: bool(fl.nvlink_up[n, g] < fl.nvlink_total[n, g])),
        description="fail-slow: `links` NVLinks drop out without an XID (the job keeps running over "
        "fewer links): the GPU communicates `slowdown` slower and its whole job waits for it, until a "
        "reset retrains the links",
    ),
    "port_congestion": Kind(
        "node",
        {"port": 0.0, "wait_per_s": 2e7, "slowdown": 0.1, "duration_s": 1800.0},
        start=_congestion(True),
        tick=_node_slow,
        stop=_congestion(False),
        description="fail-slow: RDMA port `port` of the node is congested for duration_s: "
        "port_xmit_wait rises by wait_per_s, the node's GPUs communicate `slowdown` slower and the "
        "job's other nodes wait for them (needs scenario ports)",
    ),
    "job_slowdown": Kind(
        "node",
        {"slowdown": 0.15, "duration_s": 600.0},
        tick=_node_slow,
        stop=_node_fast,
        description="fail-slow without a culprit GPU: the node's ranks wait on their host (a data "
        "loader, storage) `slowdown` of the time for duration_s, and every GPU of the job, on every "
        "node of it, waits with them at lower power; no GPU's clock lags, so no straggler is named",
    ),
    "port_flap": Kind(
        "node",
        {"port": 0.0, "down_s": 20.0},
        start=_port_flap,
        description="RDMA port `port` of the node fails its link error recovery: link_downed +1, "
        "DOWN / Polling for down_s, then ACTIVE again (needs scenario ports)",
    ),
    "port_downtrain": Kind(
        "node",
        {"port": 0.0, "rate_gbps": 200.0},
        start=_port_downtrain,
        description="RDMA port `port` trains down to rate_gbps (a lane lost) until the node reboots",
    ),
    "port_symbol_burst": Kind(
        "node",
        {"port": 0.0, "rate_per_s": 5.0, "duration_s": 600.0},
        start=_port_symbols(True),
        stop=_port_symbols(False),
        visible=lambda f: f.start + 1.0 / max(f.params["rate_per_s"], 1e-9),
        description="symbol errors on RDMA port `port` at rate_per_s for duration_s (a dirty cable)",
    ),
    "hca_missing": Kind(
        "node",
        {"port": 0.0},
        start=_hca_missing,
        description="the HCA of RDMA port `port` falls off the bus: its port is gone from the frames "
        "until the node reboots",
    ),
}
"""Every fault kind by its stable name."""
PORT_KINDS: Final = frozenset(
    {"port_flap", "port_downtrain", "port_symbol_burst", "hca_missing", "port_congestion"}
)
"""The kinds that act on the fleet's RDMA ports (a scenario with ``ports``)."""
FAIL_SLOW_KINDS: Final = frozenset({"clock_limit", "nvlink_degraded", "port_congestion", "job_slowdown"})
"""The kinds that slow a job without stopping it (#28; ``pcie_downtrain`` with a ``slowdown`` too)."""


def validate_params(kind: str, params: Mapping[str, Any]) -> dict[str, float]:
    """Defaults merged with ``params``; raises ValueError naming any unknown or non-numeric one."""
    if kind not in KINDS:
        raise ValueError(f"unknown fault kind {kind!r} (known: {', '.join(sorted(KINDS))})")
    spec = KINDS[kind]
    out = dict(spec.defaults)
    for name, value in params.items():
        if name not in spec.defaults:
            known = ", ".join(sorted(spec.defaults)) or "none"
            raise ValueError(f"{kind}: unknown parameter {name!r} (known: {known})")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{kind}: parameter {name!r} must be a number, got {value!r}")
        out[name] = float(value)
    return out
