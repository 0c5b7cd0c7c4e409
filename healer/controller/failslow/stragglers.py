"""Fail-slow detection: the GPU or node that persistently lags its job's peers under load (#28).

A synchronous job runs at the speed of its slowest rank, so a GPU that clocks 15 % low, or whose link
trained down, costs the whole job. Every second's readings are folded, for loaded samples only
(``util_gpu_pct >= LOAD_UTIL_PCT``: checkpoints, init phases and idle gaps do not count), into a window
of ``window_s``. At each window's end, all GPUs at once (numpy, no Python loop per GPU):

- peer test, for a job with at least ``min_peers`` GPUs: the robust z-score of the GPU's mean SM clock
  ratio (clock / max clock) against its job's median and MAD. The GPU lags when it is at least
  ``min_deficit`` below the median, ``z <= -z_min``, and it draws less power than its peers (a healthy
  chip that hits its power cap clocks low *at the same power*; a faulty one clocks low at less);
- own history, for a GPU in a smaller job (or none), or one whose node's GPUs of its job lag their own
  pasts together (at the median: a node slowed as a whole, which its peers on it cannot show): the same
  test against the median of its own latest past windows that did not lag (``own_history``: a phase
  of the job shorter than half of them does not move it), once ``history_windows`` windows are in. A
  GPU with peers enough whose node does not lag is judged by its peers alone: a job that moves every
  GPU's clock (into its power cap, out of it) moves a weak chip's most, and that chip's own mixed past
  would call it slow. A node's lag its job's other nodes share is the job's phase, and a window
  spent mostly at the power cap with no hardware reason is explained by the cap (a phase that needs
  more power per clock): neither is judged by its history (#39);
- link evidence, any job size: a PCIe link below its generation or width, or NVLink links down, in
  most of the window's loaded samples;
- unconstrained clock: the same deficit tests on the mean clock of the loaded samples that no power
  cap, temperature, sync-boost group or clock setting limits (``CAPPED_BITS``, under ``FREE_POWER`` of
  the limit), against its job's peers and against its own past such windows, kept across jobs (that
  clock is the chip's, not the job's). There a healthy chip runs at its peers' clock whatever its chip
  factor, its phase mix or its job, so the spread of power-capped peers hides nothing, a whole node
  slowed as a new job starts is compared with what its chips ran at before, and ``free_persist`` (2)
  windows confirm it.

A node lags its job's nodes (a job on ``min_nodes`` nodes or more) when its GPUs' median clock does.
A GPU (node) becomes a straggler after ``persist`` lagging windows in a row (``free_persist`` for the
unconstrained clock); a window with too few loaded (unconstrained) samples neither counts nor resets.
The verdict feeds the rules as ``straggler_score`` (1/0), so the incident shell, gates, ladder and the
default pack's ``gpu-straggler`` rule handle it like any fault; ``evidence`` gives the incident its
job, its peers' median, and the cause the telemetry names (clock reasons decoded, a down-trained link;
an RDMA port of the node trained down, erroring or congested in the last 10 minutes, ``PortWatch``).
Pipeline stages or a rank 0 that logs do different work at the same clock, so the clock, not power or
utilisation, is the test.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np

from healer.controller.failslow import node_test, own_history, peer_stats, straggler_settings
from healer.controller.failslow.clock_reasons import (
    CAPPED_BITS,
    FREE_POWER,
    OFFCAP_BITS,
    cap_explains,
    describe_cause,
)
from healer.schemas import framecols, telemetry

LOAD_UTIL_PCT: Final = 50.0
"""A sample counts only at this utilisation or more: the GPU computes (not a checkpoint or idle)."""
FIELDS: Final = ("clock", "power", "link_down", "free_clock", "offcap_clock", "offcap")
"""Window sums per slot; ``offcap``: loaded samples off the power cap and not thermally limited
(``OFFCAP_BITS``), counted, ``offcap_clock`` their clock ratios."""
PENDING_MAX: Final = 1 << 16
"""GPU readings held as Python tuples before they are folded into the arrays."""
_READ: Final = (
    "index", "util_gpu_pct", "sm_clock_mhz", "sm_clock_max_mhz", "power_w", "power_limit_w", "pcie_gen",
    "pcie_gen_max", "nvlink_links_up", "nvlink_links_total", "pcie_width", "pcie_width_max",
    "clocks_event_reasons",
)  # fmt: skip
_READ_COLUMNS: Final = np.array([framecols.COLUMN[c] for c in _READ], dtype=np.intp)
"""What ``Scorer.observe`` reads of a GPU, as columns of a frame's plane rows (``Frame.readings``)."""


class Scorer:
    """Folds frames per GPU slot, scores at each window's end; ``stragglers`` is the confirmed set."""

    def __init__(self, settings: straggler_settings.Settings | None = None) -> None:
        self.s = settings or straggler_settings.Settings()
        self._slot: dict[tuple[str, int], int] = {}
        self._keys: list[tuple[str, int]] = []
        self._sum = np.zeros((len(FIELDS), 0))
        self._reasons = np.zeros(0, dtype=np.int64)
        self._loaded = np.zeros(0)
        self._samples = np.zeros(0)
        self._streak = np.zeros(0, dtype=np.int64)
        self._own = own_history.OwnHistory(self.s.history_span, self.s.history_alpha)
        self._hist_job: list[str | None] = []
        self._node_no = np.zeros(0, dtype=np.int64)
        """Per slot: its node's number (``_node_no_of``), to group a job's GPUs by node."""
        self._node_no_of: dict[str, int] = {}
        self._free = np.zeros(0)
        self._free_streak = np.zeros(0, dtype=np.int64)
        self._free_kind = np.zeros(0, dtype=np.int64)
        """Per slot: the free-clock test that last lagged (1 peers, 2 own history)."""
        self._fhist = np.full(0, np.nan)
        self._fhist_n = np.zeros(0, dtype=np.int64)
        self._nodes = node_test.NodeTest(self.s)
        self._node_slots: dict[str, dict[int, int]] = {}
        self._node_last: dict[str, float] = {}
        self._pending: list[tuple[int, float, float, float, float, float, int]] = []
        """(slot, clock ratio, power ratio, link down, free clock ratio, off-cap clock ratio, reasons) per
        reading since the last fold: a clock ratio of 0 is a sample without load, a free (off-cap) clock
        ratio of 0 one that is not unconstrained (off the cap)."""
        self.window_start: float | None = None
        self.stragglers: dict[tuple[str, int | None], straggler_settings.Straggler] = {}
        self.job_nodes: dict[str, list[str]] = {}
        """Each job's nodes with a loaded window in the last ``score`` (the port test compares them)."""
        self.pending_jobs: set[str] = set()
        """Jobs with a GPU or node that lagged in the last window but is not (yet) a straggler."""

    def _grow(self, n: int) -> None:
        size = self._loaded.size
        if n <= size:
            return
        extra = max(n - size, size, 64)
        self._sum = np.pad(self._sum, ((0, 0), (0, extra)))
        self._reasons = np.pad(self._reasons, (0, extra))
        self._loaded = np.pad(self._loaded, (0, extra))
        self._samples = np.pad(self._samples, (0, extra))
        self._streak = np.pad(self._streak, (0, extra))
        self._own.grow(extra)
        self._node_no = np.pad(self._node_no, (0, extra))
        self._free = np.pad(self._free, (0, extra))
        self._free_streak = np.pad(self._free_streak, (0, extra))
        self._free_kind = np.pad(self._free_kind, (0, extra))
        self._fhist = np.pad(self._fhist, (0, extra), constant_values=np.nan)
        self._fhist_n = np.pad(self._fhist_n, (0, extra))

    def slot(self, node: str, gpu: int) -> int:
        i = self._slot.get((node, gpu))
        if i is None:
            i = self._slot[(node, gpu)] = len(self._keys)
            self._keys.append((node, gpu))
            self._hist_job.append(None)
            self._grow(i + 1)
            self._node_no[i] = self._node_no_of.setdefault(node, len(self._node_no_of))
        return i

    def observe(self, frame: telemetry.FrameView) -> bool:
        """One frame's GPUs into the current window (Python lists here, folded into the arrays when the
        window is scored: a numpy scalar update costs more than the whole reading); False when the
        node's last folded frame is less than ``sample_every_s`` old (skipped)."""
        node = frame.node
        last = self._node_last.get(node)
        if last is not None and 0 <= frame.ts - last < self.s.sample_every_s:
            return False
        self._node_last[node] = frame.ts
        slots = self._node_slots.get(node)
        if slots is None:
            slots = self._node_slots[node] = {}
        pending = self._pending
        if len(pending) >= PENDING_MAX:
            self._fold_pending()
            pending = self._pending
        rows = frame.readings(_READ_COLUMNS) if isinstance(frame, framecols.Frame) else None
        if rows is not None:
            self._observe_rows(node, slots, rows)
            return True
        for g in frame.gpus:
            i = slots.get(g.index)
            if i is None:
                i = slots[g.index] = self.slot(node, g.index)
            util, clock, clock_max = g.util_gpu_pct, g.sm_clock_mhz, g.sm_clock_max_mhz
            power, limit = g.power_w, g.power_limit_w
            if util is None or util < LOAD_UTIL_PCT or not clock or not clock_max or not power or not limit:
                pending.append((i, 0.0, 0.0, 0.0, 0.0, 0.0, 0))
                continue
            gen, gen_max = getattr(g, "pcie_gen", None), getattr(g, "pcie_gen_max", None)
            up, total = getattr(g, "nvlink_links_up", None), getattr(g, "nvlink_links_total", None)
            width, width_max = getattr(g, "pcie_width", None), getattr(g, "pcie_width_max", None)
            down = (
                (gen is not None and gen_max is not None and gen < gen_max)
                or (up is not None and total is not None and up < total)
                or (width is not None and width_max is not None and width < width_max)
            )
            reasons = g.clocks_event_reasons or 0
            ratio, share = clock / clock_max, power / limit
            off = ratio if share < FREE_POWER and not reasons & OFFCAP_BITS else 0.0
            free = off if not reasons & CAPPED_BITS else 0.0
            pending.append((i, ratio, share, 1.0 if down else 0.0, free, off, reasons))
        return True

    def _observe_rows(self, node: str, slots: dict[int, int], rows: list[list[float]]) -> None:
        """``observe``'s loop over a frame's plane rows (``_READ``; NaN where null, every integer exact):
        the same readings as from its GPUs' objects (each NaN test below is the null test there)."""
        pending = self._pending
        for (
            index,
            util,
            clock,
            clock_max,
            power,
            limit,
            gen,
            gen_max,
            up,
            total,
            width,
            width_max,
            bits,
        ) in rows:
            g = int(index)
            i = slots.get(g)
            if i is None:
                i = slots[g] = self.slot(node, g)
            # ``not x`` for a null or zero reading: these are never negative (the schema's bounds)
            if (
                not util >= LOAD_UTIL_PCT
                or not clock > 0
                or not clock_max > 0
                or not power > 0
                or not limit > 0
            ):
                pending.append((i, 0.0, 0.0, 0.0, 0.0, 0.0, 0))
                continue
            down = gen < gen_max or up < total or width < width_max  # False where either is null
            reasons = 0 if bits != bits else int(bits)
            ratio, share = clock / clock_max, power / limit
            off = ratio if share < FREE_POWER and not reasons & OFFCAP_BITS else 0.0
            free = off if not reasons & CAPPED_BITS else 0.0
            pending.append((i, ratio, share, 1.0 if down else 0.0, free, off, reasons))

    def _fold_pending(self) -> None:
        if not self._pending:
            return
        cols = np.array(self._pending, dtype=np.float64).T
        self._pending = []
        idx = cols[0].astype(np.int64)
        np.add.at(self._samples, idx, 1.0)
        np.add.at(self._loaded, idx, cols[1] > 0)
        for row in range(5):
            np.add.at(self._sum[row], idx, cols[1 + row])
        np.add.at(self._sum[5], idx, cols[5] > 0)
        np.add.at(self._free, idx, cols[4] > 0)
        np.bitwise_or.at(self._reasons, idx, cols[6].astype(np.int64))

    def observe_arrays(
        self,
        idx: np.ndarray,
        util: np.ndarray,
        clock_ratio: np.ndarray,
        power_ratio: np.ndarray,
        reasons: np.ndarray,
        link_down: np.ndarray,
    ) -> None:
        """A whole fleet's readings at once (benchmarks, the evaluation): slots ``idx``."""
        self._samples[idx] += 1
        ok = (util >= LOAD_UTIL_PCT) & np.isfinite(clock_ratio) & np.isfinite(power_ratio)
        j = idx[ok]
        self._loaded[j] += 1
        self._sum[0, j] += clock_ratio[ok]
        self._sum[1, j] += power_ratio[ok]
        self._sum[2, j] += link_down[ok]
        self._reasons[j] |= reasons[ok]
        off = ok & ((reasons & OFFCAP_BITS) == 0) & (power_ratio < FREE_POWER)
        self._sum[4, idx[off]] += clock_ratio[off]
        self._sum[5, idx[off]] += 1
        free = off & ((reasons & CAPPED_BITS) == 0)
        f = idx[free]
        self._free[f] += 1
        self._sum[3, f] += clock_ratio[free]

    def due(self, now: float) -> bool:
        if self.window_start is None:
            self.window_start = now
        return now - self.window_start >= self.s.window_s

    def score(
        self, now: float, job_of: Mapping[tuple[str, int], str | None]
    ) -> list[straggler_settings.Straggler]:
        """Close the window: the new verdicts (``stragglers`` updated); the next window starts at ``now``."""
        self._fold_pending()
        n = len(self._keys)
        s = self.s
        loaded, samples = self._loaded[:n], self._samples[:n]
        valid = (samples > 0) & (loaded >= s.min_loaded * np.maximum(samples, 1))
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = self._sum[:, :n] / loaded
        clock, power, link = mean[0], mean[1], mean[2]
        jobs = [job_of.get(k) for k in self._keys]
        codes, job_names = peer_stats.codes(jobs, valid)
        test = np.full(n, "", dtype=object)
        big, size, ref_clock, ref_power, z = self._peers(codes, clock, power)
        c = codes
        with np.errstate(invalid="ignore", divide="ignore"):
            peer_lag = big & (z <= -s.z_min) & (1 - clock / ref_clock >= s.min_deficit)
            peer_lag &= power <= ref_power - s.power_margin
            # own history: a small job's GPUs, and a GPU whose node's GPUs of its job lag their own
            # pasts as a whole (a node-wide slowdown of a one-node job has no healthy peer); it starts
            # again when the slot's job changes
            self._restart_histories(jobs)
            hist_clock, hist_power = self._own.reference(n)
            warm = valid & (self._own.count[:n] >= s.history_windows) & ~peer_lag
            own = 1 - clock / hist_clock
            # with peers enough, a GPU within its job's spread is no straggler: a job whose phase moves
            # every GPU's clock (into its power cap, out of it) moves a weak chip's most; a node's lag its
            # job's other nodes share, or one its power cap explains, is a phase, not a fault (#39)
            judged = self._judged(codes, big, warm, own)
            hist_lag = warm & judged & (own >= s.min_deficit) & (power <= hist_power - s.power_margin)
        ref_clock[hist_lag], ref_power[hist_lag] = hist_clock[hist_lag], hist_power[hist_lag]
        deficit = 1 - clock / ref_clock
        lag = peer_lag | hist_lag
        test[peer_lag & lag] = "peers"
        test[hist_lag & lag] = "history"
        link_lag = valid & (link >= s.link_share)
        test[link_lag & ~lag] = "link"
        lag |= link_lag
        loaded_ref = (np.where(big, ref_clock, np.nan), np.where(big, ref_power, np.nan), power)
        free_lag, fclock, fref, fz, fsize = self._free_test(codes, valid, lag, loaded_ref)
        # learn the history from windows that did not lag
        self._own.learn(valid & ~lag & ~free_lag, clock, power)
        streak = self._streak[:n]
        streak[valid & lag], streak[valid & ~lag] = streak[valid & lag] + 1, 0
        free_streak = self._free_streak[:n]
        by_free = (free_streak >= s.free_persist) & valid  # the cleaner evidence, when both name it
        by_all = (streak >= s.persist) & valid & ~by_free
        confirmed = by_all | by_free  # a window without load shows 0; the rule's resolve waits
        # a GPU named by its unconstrained clock shows that clock and its reference
        shown, z, deficit = clock.copy(), z.copy(), deficit.copy()  # the node test reads the loaded clock
        ref_clock[by_free], z[by_free] = fref[by_free], fz[by_free]
        seen = by_free & np.isfinite(fclock)  # a window without unconstrained samples shows the loaded one
        shown[seen] = fclock[seen]
        with np.errstate(invalid="ignore", divide="ignore"):
            deficit[by_free] = 1 - fclock[by_free] / fref[by_free]
        test[by_free] = np.where(self._free_kind[:n][by_free] == 1, "peers", "history")
        self.stragglers = {}
        for i in np.flatnonzero(confirmed).tolist():
            node, gpu = self._keys[i]
            ev = straggler_settings.evidence(
                (float(shown[i]), float(power[i]), float(ref_clock[i]), float(deficit[i]), float(z[i])),
                int(streak[i] if by_all[i] else free_streak[i]),
                bool(by_free[i]),
                int(fsize[i] if by_free[i] else size[c[i]]),
                jobs[i],
                describe_cause(int(self._reasons[i]), float(link[i]) >= s.link_share),
            )
            self.stragglers[(node, gpu)] = straggler_settings.Straggler(node, gpu, jobs[i], str(test[i]), ev)
        self.job_nodes, nodes = self._nodes.score(self._keys, codes, job_names, clock, valid)
        self.stragglers |= nodes
        pending = valid & ~confirmed & ((streak > 0) | (free_streak > 0))
        self.pending_jobs = {str(jobs[i]) for i in np.flatnonzero(pending).tolist() if jobs[i] is not None}
        self.pending_jobs |= self._nodes.pending()
        self._reset(now)
        return list(self.stragglers.values())

    def _peers(
        self, codes: np.ndarray, clock: np.ndarray, power: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per slot, against its job's peers: whether the job has ``min_peers`` (big), the job's size,
        its median clock and power (the reference) and the slot's robust z-score (NaN where not big).
        Median and MAD per job are vectorised by sorting on the job code (one more entry, NaN / 0, at
        the end: code -1, no job, reads it)."""
        s, n = self.s, codes.size
        ref_clock, ref_power, z = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
        med, mad, size = (
            np.append(a, fill)
            for a, fill in zip(peer_stats.group_median_mad(codes, clock), (np.nan, np.nan, 0), strict=True)
        )
        pmed = np.append(peer_stats.group_median_mad(codes, power)[0], np.nan)
        big = (codes >= 0) & (size[codes] >= s.min_peers)
        c = codes
        ref_clock[big], ref_power[big] = med[c[big]], pmed[c[big]]
        z[big] = (clock[big] - ref_clock[big]) / np.maximum(1.4826 * mad[c[big]], s.mad_floor)
        return big, size, ref_clock, ref_power, z

    def _restart_histories(self, jobs: Sequence[str | None]) -> None:
        """A slot's own history starts again when its job changes."""
        changed = [i for i, job in enumerate(jobs) if self._hist_job[i] != job]
        for i in changed:
            self._hist_job[i] = jobs[i]
        if changed:
            self._own.restart(np.array(changed, dtype=np.intp))

    def _judged(self, codes: np.ndarray, big: np.ndarray, warm: np.ndarray, own: np.ndarray) -> np.ndarray:
        """Per slot: whether its own history judges it: a GPU of a small job (or none), or one whose node's
        GPUs of its job lag their own pasts together while its job's other nodes do not
        (``peer_stats.node_lags``); and in either case only where its power-to-clock relation does not
        explain its window's clock (``clock_reasons.cap_explains``: mostly at its cap, no hardware
        reason)."""
        n = codes.size
        lags = peer_stats.node_lags(codes, self._node_no[:n], warm, own, self.s.min_deficit)
        explained = cap_explains(self._loaded[:n], self._free[:n], self._reasons[:n], self.s.cap_share)
        out: np.ndarray = (~big | lags) & ~explained
        return out

    def _free_test(
        self,
        codes: np.ndarray,
        valid: np.ndarray,
        lag: np.ndarray,
        loaded: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The unconstrained-clock tests (``Settings.free_min``): each GPU's mean clock over its loaded
        samples below its power cap and not thermally limited, against its job's peers' (median, MAD)
        and against its own past such windows (an exponentially weighted mean kept across jobs, so a
        whole node slowed early in a job, or before a new job, is compared with what its chips ran at
        before); and its off-cap clock (``OFFCAP_BITS``: a clock set for the job allowed) against its
        job's loaded clock (``loaded``: the job's median clock and power where it has ``min_peers`` GPUs
        or more, else NaN, and the GPU's power). A cap only lowers a clock, so a healthy chip off its
        cap and not hot never clocks well below what its peers run at, capped or not: 8 % below them at
        less power is a fault however wide their spread (#39). Updates the free streak and history;
        returns (lagging, free clock, its reference, z, peers) per slot (NaN / 0 where not known)."""
        s = self.s
        n = len(self._keys)
        free_n = self._free[:n]
        fvalid = valid & (free_n >= s.free_min)
        with np.errstate(invalid="ignore", divide="ignore"):
            fclock = self._sum[3, :n] / free_n
        fcodes = np.where(fvalid, codes, -1)
        med, mad, size = (
            np.append(a, fill)
            for a, fill in zip(peer_stats.group_median_mad(fcodes, fclock), (np.nan, np.nan, 0), strict=True)
        )
        big = (fcodes >= 0) & (size[fcodes] >= s.min_peers)
        fref, fz, fsize = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, dtype=np.int64)
        fref[big], fsize[big] = med[fcodes[big]], size[fcodes[big]]
        fz[big] = (fclock[big] - fref[big]) / np.maximum(1.4826 * mad[fcodes[big]], s.mad_floor)
        hist = self._fhist[:n]
        ref_clock, ref_power, power = loaded
        with np.errstate(invalid="ignore", divide="ignore"):
            offcap = self._sum[4, :n] / self._sum[5, :n]  # NaN under ``free_min`` such samples
        offcap[~(self._sum[5, :n] >= s.free_min)] = np.nan
        with np.errstate(invalid="ignore", divide="ignore"):
            peer_lag = big & (fz <= -s.z_min) & (1 - fclock / fref >= s.min_deficit)
            below = valid & ~peer_lag & (1 - offcap / ref_clock >= s.min_deficit)
            below &= power <= ref_power - s.power_margin
            fref[below], fz[below], fclock[below] = ref_clock[below], np.nan, offcap[below]
            peer_lag |= below
            warm = fvalid & (self._fhist_n[:n] >= s.free_history_windows) & ~peer_lag
            hist_lag = warm & (1 - fclock / hist >= s.min_deficit)
        fref[hist_lag] = hist[hist_lag]
        fz[hist_lag], fsize[hist_lag] = np.nan, 0
        free_lag = peer_lag | hist_lag
        kind = self._free_kind[:n]
        kind[peer_lag], kind[hist_lag] = 1, 2
        streak = self._free_streak[:n]
        streak[(fvalid | below) & free_lag] += 1
        streak[fvalid & ~free_lag] = 0
        learn = fvalid & ~free_lag & ~lag
        first = learn & (self._fhist_n[:n] == 0)
        rest = learn & ~first
        a = s.history_alpha
        hist[first] = fclock[first]
        hist[rest] = (1 - a) * hist[rest] + a * fclock[rest]
        self._fhist_n[:n][learn] += 1
        return free_lag, fclock, fref, fz, fsize

    def _reset(self, now: float) -> None:
        self._sum[:] = 0.0
        self._reasons[:] = 0
        self._loaded[:] = 0.0
        self._samples[:] = 0.0
        self._free[:] = 0.0
        self.window_start = now

    def scores(self) -> dict[str, dict[int, float]]:
        """Per node, per GPU: 1 for a straggler (a lagging node: all its GPUs), else 0."""
        out: dict[str, dict[int, float]] = {}
        for node, gpu in self._keys:
            out.setdefault(node, {})[gpu] = 0.0
        for found in self.stragglers.values():
            if found.gpu is None:
                out[found.node] = dict.fromkeys(out.get(found.node, {}), 1.0)
            else:
                out.setdefault(found.node, {})[found.gpu] = 1.0
        return out
