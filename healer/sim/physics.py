"""The physics engine: every GPU of the simulated fleet as numpy arrays of shape (nodes, gpus).

One ``step(dt)`` advances the whole fleet: workloads set utilisation, power follows utilisation and is
capped by the power limit (and by thermal regulation when cooling is short), temperature follows power
through a first-order thermal model on top of the node inlet and each GPU's cooling efficiency, clocks
drop with the matching NVML ``clocks_event_reasons`` bits (a power cap: with the cube root of the
dynamic power left, as at the top of a real GPU's DVFS curve), and cumulative counters advance by the fault
rates the injector has set. Nothing here builds a pydantic model; ``frames`` turns the arrays into
NodeFrame JSON. Faults act by writing to the public arrays (``cool_factor``, ``sbe_rate``, ``present``
...) and by calling ``emit_event``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from healer import errors
from healer.schemas import events as events_schema
from healer.schemas import fields
from healer.sim import hca, profiles, ranks, variation, workloads
from healer.telemetry import source

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
BOOL = npt.NDArray[np.bool_]

COUNTERS = tuple(n for n in fields.ERROR_COUNTERS if n != "retired_pages")
"""The error counters simulated (pre-Ampere page retirement is not), from ``healer.schemas.fields``."""
VOLATILE = tuple(n for n in COUNTERS if n in fields.CLEARED_BY_RESET)
"""Counters a GPU reset or driver reload clears (aggregate ECC and remapped rows persist)."""
WAIT_POWER: Final = 0.3
"""Share of its dynamic power a rank draws while it waits for the job's slowest rank (NCCL spins)."""


def boot_id(run_id: str, node: int, boot_no: int) -> str:
    """A node agent's boot id: new on every (simulated) agent start."""
    return f"{run_id}-{node}-{boot_no}"


class Fleet:
    """State and physics of N nodes with G GPUs each (one GPU model per node)."""

    def __init__(
        self,
        node_names: Sequence[str],
        gpus: int,
        node_profiles: Sequence[profiles.Profile],
        *,
        seed: int,
        start_ts: float,
        run_id: str,
        workload_mix: Mapping[str, float],
        inlet_c: float = 25.0,
        inlet_spread_c: float = 2.0,
        vary: variation.Drawn | None = None,
        gang: npt.NDArray[np.intp] | None = None,
    ) -> None:
        n = len(node_names)
        self.node_names = list(node_names)
        self.nodes, self.gpus = n, gpus
        self.profiles = list(node_profiles)
        self.run_id = run_id
        self.t = start_ts
        ss = np.random.SeedSequence(seed)
        phys_ss, work_ss = ss.spawn(2)
        self._rng = np.random.default_rng(phys_ss)
        self.vary = vary or variation.Drawn()
        # variation draws come from their own generator, so a scenario without variation is unchanged
        self._vrng = np.random.default_rng(np.random.SeedSequence([seed, 0x7A41]))
        self.work: workloads.Workloads | workloads.VariedWorkloads
        if self.vary.varied_jobs:
            self.work = workloads.VariedWorkloads(
                n, gpus, workload_mix, np.random.default_rng(work_ss), start_ts, self.vary, gang
            )
        else:
            self.work = workloads.Workloads(
                n, gpus, workload_mix, np.random.default_rng(work_ss), start_ts, gang
            )
        self.fault_history: dict[tuple[int, int | None], list[tuple[float, str]]] = {}
        """Per GPU (node, gpu; gpu None for a node-scope fault): (start time, kind) of every fault it had,
        so the recovery ladder's "N recoveries in a window" rule can be exercised on a simulated fleet."""

        self._init_datasheets()

        shape = (n, gpus)
        self.inlet_base = inlet_c + self._rng.uniform(-inlet_spread_c, inlet_spread_c, n)
        self.inlet_delta = np.zeros(n)
        self.cool_base = np.clip(self._rng.normal(1.0, 0.04, shape), 0.85, 1.15)
        self._init_variation(inlet_c)
        self._init_state(seed)
        self.silent = np.zeros(n, dtype=np.bool_)
        self.ports: hca.Ports | None = None
        """The nodes' RDMA ports (scenario ``ports``; sim/hca.py); None: frames carry no ports."""
        self.boot_no = np.zeros(n, dtype=np.int64)
        self.seq = np.zeros(n, dtype=np.int64)
        self.events: list[dict[str, Any]] = []
        self._event_no = 0
        self.uuids = [[f"GPU-{run_id}-{i:05d}-{g:02d}" for g in range(gpus)] for i in range(n)]
        for i in range(n):
            self.emit_event(i, "agent_start", message="simulated agent started")

    def _init_datasheets(self) -> None:
        """Each GPU's datasheet figures (power envelope, temperatures, clocks, thermal model, links), as
        (nodes, gpus) arrays."""
        gpus = self.gpus

        def per_gpu(attr: str) -> F64:
            vals = np.array([p.figure(attr) for p in self.profiles], dtype=np.float64)
            return np.repeat(vals[:, None], gpus, axis=1)

        self.p_default, self.p_min, self.p_max = (
            per_gpu("power_default_w"),
            per_gpu("power_min_w"),
            per_gpu("power_max_w"),
        )
        self.p_idle, self.p_full = per_gpu("power_idle_w"), per_gpu("power_full_w")
        self.slowdown_c, self.shutdown_c = per_gpu("slowdown_temp_c"), per_gpu("shutdown_temp_c")
        self.maxop_c, self.mem_max_c = per_gpu("max_operating_temp_c"), per_gpu("mem_max_temp_c")
        self.mem_total, self.sm_max, self.sm_idle = (
            per_gpu("mem_total_mib"),
            per_gpu("sm_clock_max_mhz"),
            per_gpu("sm_clock_idle_mhz"),
        )
        self.c_per_w, self.tau_s, self.hbm_off = (
            per_gpu("thermal_c_per_w"),
            per_gpu("thermal_tau_s"),
            per_gpu("hbm_offset_c"),
        )
        self.nvlink_total = per_gpu("nvlink_links").astype(np.int64)
        self.pcie_gen_max = per_gpu("pcie_gen_max").astype(np.int64)
        self.pcie_width_max = per_gpu("pcie_width_max").astype(np.int64)

    def _init_state(self, seed: int) -> None:
        """Every GPU's dynamic state at start: readings, counters, fault rates and the fail-slow knobs."""
        shape = (self.nodes, self.gpus)
        self.cool_factor = np.ones(shape)
        self.power_limit = self.p_default.copy()
        self.util = self.work.util.copy()
        self.util_mem = np.zeros(shape)
        self.mem_used = np.zeros(shape)
        self.power = self.p_idle.copy()
        self.temp = self._steady(self.power) + self._rng.normal(0.0, 1.0, shape)
        self.mem_temp = self.temp + 2.0
        self.energy = np.zeros(shape)
        self.sm_clock = self.sm_idle.copy()
        self.reasons = np.zeros(shape, dtype=np.int64)
        self.counters: dict[str, I64] = {name: np.zeros(shape, dtype=np.int64) for name in COUNTERS}
        self.nvlink_up = self.nvlink_total.copy()
        self.pcie_gen = self.pcie_gen_max.copy()
        self.pcie_width = self.pcie_width_max.copy()
        self.recovery = np.zeros(shape, dtype=np.int64)
        self.remap_pending = np.zeros(shape, dtype=np.bool_)
        self.remap_failure = np.zeros(shape, dtype=np.bool_)
        self.present = np.ones(shape, dtype=np.bool_)
        self.brake = np.zeros(shape, dtype=np.bool_)
        self.sbe_rate = np.zeros(shape)
        self.nvlink_crc_rate = np.zeros(shape)
        self.pcie_replay_rate = np.zeros(shape)
        self.clock_cap = np.ones(shape)
        """Fail-slow: the share of its maximum SM clock a GPU can reach under load (a bad power stage:
        HW slowdown); its dynamic power follows the clock's cube, as on the DVFS curve."""
        self.comm_speed = np.ones(shape)
        """Fail-slow: how fast a GPU's communication runs (a down-trained link, a congested port: < 1)."""
        self.wait: F64 = np.zeros(shape)
        """Each GPU's share of time waiting for the slowest rank of its job (set by ``physics``)."""
        self.job = self.work.jobs()
        """Each GPU's job number (-1: no job); frames carry it as ``jobs``."""
        self._seed = seed
        self._training = self.work.training()
        self.ranks = ranks.layout(self.job, self._training, self.vary, seed)
        """Each GPU's rank in its training job and the work a step asks of it (sim/ranks.py)."""
        self.job_time: F64 = np.ones(shape)
        """Each GPU's job's time per step against its nominal step: its slowest rank's work / speed."""

    # ----------------------------------------------------------------- physics

    def _init_variation(self, inlet_c: float) -> None:
        v, rng, (n, g) = self.vary, self._vrng, self.cool_base.shape
        if v.resistance_sigma > 0:
            self.cool_base = np.exp(-rng.normal(0.0, v.resistance_sigma, (n, g)))
        self.rear = np.zeros((n, g))
        self.rear[:, g // 2 :] = 1.0
        self.preheat_c = v.rear_preheat_c * rng.uniform(0.5, 1.0, n)
        racks = max(1, -(-n // v.rack_nodes)) if v.rack_nodes else n
        self.rack = np.arange(n) // v.rack_nodes if v.rack_nodes else np.arange(n)
        if v.rack_nodes:
            rack_base = inlet_c + rng.uniform(-v.rack_inlet_spread_c, v.rack_inlet_spread_c, racks)
            self.inlet_base = rack_base[self.rack] + rng.uniform(-0.5, 0.5, n)
        self.swing_phase = rng.uniform(0.0, 2 * np.pi, racks)
        self.drift = rng.normal(0.0, v.drift_c, racks)
        self.fan_gain = v.fan_gain * rng.uniform(0.5, 1.0, n)
        self.fan = np.zeros(n)

    def _inlet_var(self) -> F64:
        """Node inlet's time-varying part: the rack's daily swing and drift."""
        v = self.vary
        if not (v.daily_swing_c or v.drift_c):
            return np.zeros(self.nodes)
        swing: F64 = v.daily_swing_c * np.sin(2 * np.pi * self.t / 86400.0 + self.swing_phase)
        total: F64 = np.asarray(swing + self.drift)
        out: F64 = total[self.rack]
        return out

    def _resistance(self) -> F64:
        out: F64 = self.c_per_w / (self.cool_base * np.maximum(self.cool_factor, 0.05))
        if self.vary.fan_gain:
            out = out * (1.0 - (self.fan_gain * self.fan)[:, None])
        return out

    def _inlet(self) -> F64:
        node = self.inlet_base + self.inlet_delta + self._inlet_var()
        out: F64 = np.broadcast_to(node[:, None], self.cool_base.shape)
        if self.vary.rear_preheat_c:
            g = self.gpus // 2
            front: F64 = np.zeros(self.nodes)
            if hasattr(self, "power"):
                front = np.mean(self.power[:, :g] / self.p_default[:, :g], axis=1)
            out = out + self.rear * (self.preheat_c * front)[:, None]
        return out

    def _vary_step(self, dt: float) -> None:
        v, rng = self.vary, self._vrng
        if v.drift_c:
            k = dt / (6 * 3600.0)
            self.drift += -self.drift * k + rng.normal(0.0, v.drift_c * np.sqrt(2 * k), self.drift.shape)
        if v.fan_gain:
            want = np.clip((self.temp.max(axis=1) - 50.0) / 40.0, 0.0, 1.0)
            self.fan += (want - self.fan) * (1.0 - np.exp(-dt / 60.0))

    def _steady(self, power_w: F64) -> F64:
        out: F64 = self._inlet() + power_w * self._resistance()
        return out

    def step(self, dt: float) -> None:
        """Advance the clock and every GPU by ``dt`` seconds."""
        self.t += dt
        self.physics(dt)

    def physics(self, dt: float) -> None:
        """Advance every GPU by ``dt`` seconds at the current clock (faults already applied)."""
        rng = self._rng
        self._vary_step(dt)
        util = self.work.step(self.t, dt)
        self.util = util
        if self.ports is not None:
            self.ports.step(self.t, dt, util)
        wanted = self.p_idle + (self.p_full - self.p_idle) * util / 100.0
        r = self._resistance()
        inlet = self._inlet()
        p = np.minimum(wanted, self.power_limit)
        power_capped = wanted > self.power_limit
        p_hold = (self.maxop_c - inlet) / r
        sw_thermal = (self.temp >= self.maxop_c - 1.0) & (p > p_hold)
        p = np.where(sw_thermal, np.maximum(p_hold, self.p_idle * 0.8), p)
        hw_thermal = self.temp >= self.slowdown_c
        p = np.where(hw_thermal, self.p_idle + 0.25 * (p - self.p_idle), p)
        p = np.where(self.brake, self.p_idle + 0.3 * (p - self.p_idle), p)
        busy = util >= 1.0
        self._relayout()
        slow = self._fail_slow()
        if slow is not None:
            # a clock-limited GPU: its dynamic power at the lower clock (f ∝ P^(1/3), below)
            p = np.minimum(p, self.p_idle + (wanted - self.p_idle) * self.clock_cap**3)
        p = p + rng.normal(0.0, 1.0, p.shape) * np.where(busy, 4.0, 1.0)
        p = np.maximum(p, self.p_idle * 0.5)

        dyn_wanted = np.maximum(wanted - self.p_idle, 1e-6)
        ratio = np.clip((p - self.p_idle) / dyn_wanted, 0.0, 1.0)
        limited = busy & (ratio < 0.999)
        clock = np.where(busy, self.sm_max, self.sm_idle)
        # Near the top of the DVFS curve dynamic power goes roughly with f·V² and V with f: f ∝ P^(1/3) (#30).
        clock = np.where(limited, np.maximum(self.sm_idle, self.sm_max * np.cbrt(ratio)), clock)
        self.sm_clock = clock
        if slow is not None:
            # ranks that wait for the slowest one spin at WAIT_POWER of their dynamic power meanwhile;
            # their clock, measured while computing, stays where it was
            p = np.where(busy, p - (p - self.p_idle) * self.wait * (1.0 - WAIT_POWER), p)
        self.power = p
        decay = 1.0 - np.exp(-dt / self.tau_s)
        self.temp += (inlet + p * r - self.temp) * decay
        hbm_target = self.temp + self.hbm_off * (p / self.p_default) + 1.0
        self.mem_temp += (hbm_target - self.mem_temp) * np.minimum(1.0, 2.0 * decay)
        self.energy += p * dt
        why = fields.ClocksEventReason
        reasons = np.where(busy, 0, int(why.GPU_IDLE))
        reasons |= np.where(power_capped & ~sw_thermal & ~hw_thermal, int(why.SW_POWER_CAP), 0)
        reasons |= np.where(sw_thermal, int(why.SW_THERMAL_SLOWDOWN), 0)
        reasons |= np.where(hw_thermal, int(why.HW_THERMAL_SLOWDOWN | why.HW_SLOWDOWN), 0)
        reasons |= np.where(self.brake, int(why.HW_POWER_BRAKE_SLOWDOWN | why.HW_SLOWDOWN), 0)
        if slow is not None:
            reasons |= np.where(busy & (self.clock_cap < 1.0), int(why.HW_SLOWDOWN), 0)
        self.reasons = reasons.astype(np.int64)
        mem_util, mem_frac = self.work.mem_util_factor(), self.work.mem_fraction()
        self.util_mem = util * (mem_util if mem_util.ndim == 2 else mem_util[:, None])
        self.mem_used = np.maximum(
            500.0, self.mem_total * (mem_frac if mem_frac.ndim == 2 else mem_frac[:, None])
        )
        self._advance_counters(dt)

    def _relayout(self) -> None:
        """The jobs as the workloads have them now; ranks laid out again when a job started or ended."""
        job, training = self.work.jobs(), self.work.training()
        if not (np.array_equal(job, self.job) and np.array_equal(training, self._training)):
            self.ranks = ranks.layout(job, training, self.vary, self._seed)
        self.job, self._training = job, training

    def _fail_slow(self) -> F64 | None:
        """Each GPU's speed (clock cap x communication speed), and ``wait`` and ``job_time`` from it, when
        any GPU is slow or a job's ranks do uneven work; None (no wait) otherwise. A synchronous job
        steps at its slowest rank's pace: a rank with ``work`` w at clock cap c and communication speed s
        needs w / (c s) per step, the job T, the longest of these; the rank computes w / c of it and
        waits 1 - (w / c) / T (the slowest computes throughout; one slowed by its link waits as long as
        its peers do; with even work, 1 - S / c for the job's lowest speed S)."""
        if (self.clock_cap >= 1.0).all() and (self.comm_speed >= 1.0).all() and not self.vary.uneven_ranks:
            if self.wait.any():
                self.wait[:] = 0.0
            if (self.job_time != 1.0).any():
                self.job_time[:] = 1.0
            return None
        speed: F64 = self.clock_cap * self.comm_speed
        need = (self.ranks.work / np.maximum(speed, 1e-6)).ravel()
        job = self.job.ravel()
        in_job = job >= 0
        job_time = need.copy()
        if in_job.any():
            ids, inverse = np.unique(job[in_job], return_inverse=True)
            longest = np.zeros(ids.size)
            np.maximum.at(longest, inverse, need[in_job])
            job_time[in_job] = longest[inverse]
        self.job_time = job_time.reshape(speed.shape)
        computes: F64 = self.ranks.work / np.maximum(self.clock_cap, 1e-6)
        self.wait = np.clip(1.0 - computes / self.job_time, 0.0, 1.0)
        return speed

    def _advance_counters(self, dt: float) -> None:
        c = self.counters
        for rate, names in (
            (self.sbe_rate, (("ecc_sbe_volatile", 1.0), ("ecc_sbe_aggregate", 1.0))),
            (
                self.nvlink_crc_rate,
                (
                    ("nvlink_crc_flit_errors", 1.0),
                    ("nvlink_crc_data_errors", 0.01),
                    ("nvlink_replay_errors", 0.1),
                ),
            ),
            (self.pcie_replay_rate, (("pcie_replay_count", 1.0),)),
        ):
            idx = np.flatnonzero(rate)
            if not idx.size:
                continue
            lam = rate.ravel()[idx] * dt
            base = self._rng.poisson(lam)
            for name, frac in names:
                inc = base if frac == 1.0 else self._rng.binomial(base, frac)
                c[name].ravel()[idx] += inc

    # ----------------------------------------------------------------- events and lifecycle

    def boot_id(self, node: int) -> str:
        return boot_id(self.run_id, node, int(self.boot_no[node]))

    def emit_event(
        self,
        node: int,
        kind: events_schema.EventKind,
        *,
        gpu: int | None = None,
        xid: int | None = None,
        message: str = "",
    ) -> None:
        """Queue a NodeEvent (as a wire dict) with a deterministic, unique id."""
        self._event_no += 1
        name = self.node_names[node]
        self.events.append(
            {
                "schema": events_schema.SCHEMA,
                "id": f"{name}-{self.boot_id(node)}-e{self._event_no}",
                "node": name,
                "ts": round(self.t, 3),
                "kind": kind,
                "gpu_index": gpu,
                "gpu_uuid": None if gpu is None else self.uuids[node][gpu],
                "xid": xid,
                "message": message,
            }
        )

    def take_events(self) -> list[dict[str, Any]]:
        out, self.events = self.events, []
        return out

    def reset_gpu(self, node: int, gpu: int) -> None:
        """A GPU reset: volatile counters clear, a pending row remap is applied, throttles clear."""
        for name in VOLATILE:
            self.counters[name][node, gpu] = 0
        self.remap_pending[node, gpu] = False
        self.recovery[node, gpu] = profiles.RECOVERY_NONE
        self.brake[node, gpu] = False
        self.nvlink_up[node, gpu] = self.nvlink_total[node, gpu]
        self.power_limit[node, gpu] = self.p_default[node, gpu]
        self.clock_cap[node, gpu] = 1.0
        self.comm_speed[node, gpu] = 1.0

    def record_fault(self, node: int, gpu: int | None, ts: float, kind: str) -> None:
        self.fault_history.setdefault((node, gpu), []).append((ts, kind))

    def reset_gpu_checked(self, node: int, gpu: int) -> None:
        """A reset asked for through the agent: refused (PermanentError) for a GPU that fell off the bus,
        which only a reboot brings back, as ``nvidia-smi --gpu-reset`` fails for one."""
        self._check(node, gpu)
        self.reset_gpu(node, gpu)

    def restart_agent(self, node: int) -> None:
        """The agent process starts again: new boot id, sequence from zero, an ``agent_start`` event."""
        self.boot_no[node] += 1
        self.seq[node] = 0
        self.silent[node] = False
        self.emit_event(node, "agent_start", message="simulated agent started")

    def reboot_node(self, node: int) -> None:
        """Node reboot: every GPU reset, lost GPUs back on the bus, energy counters cleared."""
        for g in range(self.gpus):
            self.reset_gpu(node, g)
        self.present[node] = True
        self.energy[node] = 0.0
        self.pcie_gen[node] = self.pcie_gen_max[node]
        self.pcie_width[node] = self.pcie_width_max[node]
        if self.ports is not None:
            self.ports.reboot(node)
        self.restart_agent(node)

    # ----------------------------------------------------------------- power control

    def _check(self, node: int, gpu: int) -> None:
        if not 0 <= gpu < self.gpus:
            raise errors.PermanentError(f"no GPU {gpu} on {self.node_names[node]} ({self.gpus} GPUs)")
        if not self.present[node, gpu]:
            raise errors.PermanentError(f"GPU {gpu} on {self.node_names[node]} is lost (fallen off the bus)")

    def power_limits(self, node: int, gpu: int) -> source.PowerLimits:
        self._check(node, gpu)
        return source.PowerLimits(
            float(self.power_limit[node, gpu]),
            float(self.p_default[node, gpu]),
            float(self.p_min[node, gpu]),
            float(self.p_max[node, gpu]),
        )

    def set_power_limit(self, node: int, gpu: int, watts: float) -> None:
        self._check(node, gpu)
        lo, hi = float(self.p_min[node, gpu]), float(self.p_max[node, gpu])
        if not lo <= watts <= hi:
            raise errors.PermanentError(f"power limit {watts} W outside [{lo}, {hi}]")
        self.power_limit[node, gpu] = watts

    # ----------------------------------------------------------------- frame view

    def columns(self) -> dict[str, npt.NDArray[Any]]:
        """The dynamic GpuSample fields as (nodes, gpus) arrays (views, not copies)."""
        cols: dict[str, npt.NDArray[Any]] = {
            "temp_c": self.temp,
            "mem_temp_c": self.mem_temp,
            "power_w": self.power,
            "power_limit_w": self.power_limit,
            "energy_j": self.energy,
            "util_gpu_pct": self.util,
            "util_mem_pct": self.util_mem,
            "mem_used_mib": self.mem_used,
            "sm_clock_mhz": self.sm_clock,
            "clocks_event_reasons": self.reasons,
            "nvlink_links_up": self.nvlink_up,
            "pcie_gen": self.pcie_gen,
            "pcie_width": self.pcie_width,
            "recovery_action": self.recovery,
            "row_remap_pending": self.remap_pending,
            "row_remap_failure": self.remap_failure,
            "present": self.present,
            "job": self.job,
        }
        cols.update(self.counters)
        return cols
