"""Window features for the anomaly model, computed in batch with numpy for the whole fleet at once.

Telemetry goes through three stages, the same for training (a recording, columnar) and for the
controller (frames, through ``window.FleetWindow``), so both see identical numbers:

1. **Raw columns** (``RAW``): the GpuSample fields the model reads, one float per GPU per sample,
   ``nan`` where a node sent no frame or a GPU is missing.
2. **Buckets** (``SUMS`` + ``COUNTERS``): per GPU and ``bucket_s`` seconds, the sum of each per-sample
   channel and the increase of each error counter. Counter increases handle resets the Prometheus way:
   a counter that goes down restarted from zero, so its increase is its new value.
3. **Window features** (``BASE_FEATURES``): the sums of the last ``window_s / bucket_s`` buckets turned
   into means, ratios, peer deviations and rates (one row per GPU). ``model`` appends the two learned
   thermal residuals.

Units are in the names: ``_c`` °C, ``_frac`` a fraction of a reference (0..1, the power default limit or
100 %), ``_per_min`` events per minute over the window, ``_w_per_pct`` watts per utilisation percent.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import numpy.typing as npt

from healer.schemas import fields

F64 = npt.NDArray[np.float64]

RAW: Final = (
    "temp_c",
    "power_w",
    "power_default_w",
    "util_gpu_pct",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "clocks_event_reasons",
    "ecc_sbe_volatile",
    "nvlink_crc_flit_errors",
    "nvlink_crc_data_errors",
    "nvlink_replay_errors",
    "pcie_replay_count",
    "energy_j",
    "ts_s",
)
"""GpuSample fields read per sample, in this order (the last seven are cumulative: five error counters,
the energy counter, and the sample's own time, whose "increase" is the time the energy increase
covers)."""
RAW_COUNTERS: Final = RAW[7:]
TIME_FIELD: Final = "ts_s"
"""Not a GpuSample field: the frame's time, copied into every GPU's row."""

SUMS: Final = (
    "samples",
    "temp_c",
    "power_w",
    "power_frac",
    "util_pct",
    "clock_ratio",
    "thermal_throttle",
    "power_throttle",
)
"""Per-sample channels summed per bucket (``samples`` counts the valid samples)."""
COUNTERS: Final = ("ecc_sbe", "nvlink_crc", "nvlink_replay", "pcie_replay", "energy_j", "energy_s")
"""Counter increases per bucket; ``nvlink_crc`` is CRC flit + CRC data errors; ``energy_j`` the energy
counter's increase and ``energy_s`` the seconds it covers (0 where the GPU reports no energy)."""
RATE_COUNTERS: Final = 4
"""The first this many COUNTERS are error counters, read as rates."""
CHANNELS: Final = (*SUMS, *COUNTERS)

THERMAL_REASONS: Final = int(
    fields.ClocksEventReason.SW_THERMAL_SLOWDOWN | fields.ClocksEventReason.HW_THERMAL_SLOWDOWN
)
"""The clocks event reasons that mean heat: driver or hardware thermal slowdown."""
POWER_REASONS: Final = int(
    fields.ClocksEventReason.SW_POWER_CAP | fields.ClocksEventReason.HW_POWER_BRAKE_SLOWDOWN
)
"""The clocks event reasons that mean power: the software power cap or the hardware power brake."""

BASE_FEATURES: Final = (
    "temp_c",  # mean core temperature, °C
    "power_frac",  # mean power draw / default power limit
    "util_frac",  # mean GPU utilisation / 100
    "power_per_util_w_per_pct",  # mean power / max(mean utilisation, 5 %)
    "clock_ratio",  # mean SM clock / max SM clock
    "thermal_throttle_frac",  # share of samples with a thermal slowdown reason
    "power_throttle_frac",  # share of samples with a power cap or power brake reason
    "node_temp_c",  # median temp_c of the node's GPUs (the node's inlet proxy)
    "node_power_frac",  # median power_frac of the node's GPUs
    "temp_node_dev_c",  # temp_c - node_temp_c
    "power_node_dev_frac",  # power_frac - node_power_frac
    "ecc_sbe_per_min",  # single-bit ECC errors per minute over the window
    "nvlink_crc_per_min",  # NVLink CRC flit + data errors per minute
    "nvlink_replay_per_min",  # NVLink replay errors per minute
    "pcie_replay_per_min",  # PCIe replays per minute
    "heat_frac",  # mean power from the energy counter / default power limit (power_frac without one)
)
RATE_FEATURES: Final = BASE_FEATURES[-5:-1]


def _carry(values: F64, previous: F64) -> F64:
    """``previous`` then ``values`` along axis 0, each missing (``nan``) entry replaced by the last one
    seen before it."""
    filled = np.concatenate([previous[None], values])
    steps = np.arange(len(filled)).reshape((-1,) + (1,) * (filled.ndim - 1))
    idx = np.where(np.isnan(filled), 0, steps)
    np.maximum.accumulate(idx, axis=0, out=idx)
    out: F64 = np.take_along_axis(filled, idx, axis=0)
    return out


def counter_increase(values: F64, previous: F64) -> tuple[F64, F64]:
    """Increase of cumulative counters between consecutive samples along axis 0, and the last value
    seen (to pass as ``previous`` next time).

    ``previous`` is the last value before ``values[0]`` (``nan`` when unknown: no increase counted).
    A value below its predecessor is a reset (GPU reset, driver reload): the increase is the new value.
    Missing samples (``nan``) count nothing and the next sample is compared with the last one seen.
    """
    carried = _carry(values, previous)
    prev, cur = carried[:-1], values
    with np.errstate(invalid="ignore"):
        inc = np.where(np.isnan(prev), 0.0, np.where(cur >= prev, cur - prev, cur))
    return np.where(np.isnan(inc), 0.0, inc), carried[-1]


def grouped_counter_increase(values: F64, starts: npt.NDArray[np.intp], previous: F64) -> tuple[F64, F64]:
    """``counter_increase`` for rows grouped in contiguous blocks (one per node, sorted by time):
    ``starts`` are the blocks' first rows, ``previous`` (blocks, ...) their last values before.
    Returns the increases and each block's last value seen."""
    pos = starts + np.arange(len(starts))
    filled = np.insert(values, starts, previous, axis=0)
    steps = np.arange(len(filled)).reshape((-1,) + (1,) * (filled.ndim - 1))
    idx = np.where(np.isnan(filled), 0, steps)
    idx[pos] = steps[pos]
    np.maximum.accumulate(idx, axis=0, out=idx)
    carried = np.take_along_axis(filled, idx, axis=0)
    is_prev = np.zeros(len(filled), dtype=bool)
    is_prev[pos] = True
    before = carried[np.flatnonzero(~is_prev) - 1]
    with np.errstate(invalid="ignore"):
        inc = np.where(np.isnan(before), 0.0, np.where(values >= before, values - before, values))
    ends = np.r_[pos[1:], len(filled)] - 1
    return np.where(np.isnan(inc), 0.0, inc), carried[ends]


def channels(raw: F64, increases: F64) -> F64:
    """Per-sample channels (..., len(CHANNELS)) from raw columns (..., len(RAW)) and their counter
    increases (..., len(RAW_COUNTERS)). Invalid samples (no power reading) are all zeros."""
    temp, power, default, util, clock, clock_max, reasons = (raw[..., i] for i in range(7))
    valid = ~(np.isnan(power) | np.isnan(temp))
    # the energy counter's increase over the time since the previous sample: the true mean power, not
    # one NVML reading (a periodic load sampled at a fixed interval aliases: its readings can wander
    # for minutes while the heat the GPU makes does not); a reset or a gap of over 2 minutes is left out
    with np.errstate(invalid="ignore"):
        energy_ok = (
            ~np.isnan(raw[..., 12])
            & (increases[..., 6] > 0)
            & (increases[..., 6] <= 120.0)
            & (increases[..., 5] <= 2000.0 * increases[..., 6])
        )
    with np.errstate(invalid="ignore", divide="ignore"):
        reasons_i = np.nan_to_num(reasons).astype(np.int64)
        out = np.stack(
            [
                np.ones_like(power),
                temp,
                power,
                power / np.where(default > 0, default, np.nan),
                util,
                clock / np.where(clock_max > 0, clock_max, np.nan),
                (reasons_i & THERMAL_REASONS) != 0,
                (reasons_i & POWER_REASONS) != 0,
                increases[..., 0],
                increases[..., 1] + increases[..., 2],
                increases[..., 3],
                increases[..., 4],
                np.where(energy_ok, increases[..., 5], 0.0),
                np.where(energy_ok, increases[..., 6], 0.0),
            ],
            axis=-1,
        )
    res: F64 = np.nan_to_num(out, nan=0.0, posinf=0.0, neginf=0.0)
    res[~valid, : len(SUMS)] = 0.0
    return res


def _node_median(x: F64, valid: npt.NDArray[np.bool_]) -> F64:
    """Median over the GPU axis (-1) of the valid entries; ``nan`` for a node with none."""
    s = np.sort(np.where(valid, x, np.inf), axis=-1)
    n = valid.sum(axis=-1)
    lo = np.take_along_axis(s, np.maximum((n - 1) // 2, 0)[..., None], axis=-1)[..., 0]
    hi = np.take_along_axis(s, np.maximum(n // 2, 0)[..., None], axis=-1)[..., 0]
    out: F64 = (lo + hi) / 2
    out[n == 0] = np.nan
    return out


def window_features(sums: F64, window_s: float) -> tuple[F64, npt.NDArray[np.bool_]]:
    """Features (..., nodes, gpus, len(BASE_FEATURES)) from window sums (..., nodes, gpus, CHANNELS),
    and the mask of GPUs that had at least one valid sample in the window (others are all ``nan``)."""
    n = sums[..., 0]
    valid = n > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = sums[..., 1 : len(SUMS)] / n[..., None]
    mean[~valid] = np.nan
    temp, power, pfrac, util, clock, tthr, pthr = (mean[..., i] for i in range(7))
    node_temp = _node_median(temp, valid)[..., None] * np.ones_like(temp)
    node_pfrac = _node_median(pfrac, valid)[..., None] * np.ones_like(temp)
    rates = sums[..., len(SUMS) : len(SUMS) + RATE_COUNTERS] * (60.0 / window_s)
    energy, energy_s = sums[..., len(SUMS) + 4], sums[..., len(SUMS) + 5]
    with np.errstate(invalid="ignore", divide="ignore"):
        default_w = power / pfrac
        heat = np.where(energy_s >= 0.5 * window_s, energy / energy_s / default_w, pfrac)
    heat = np.where(np.isnan(heat), pfrac, heat)
    feats = np.stack(
        [
            temp,
            pfrac,
            util / 100.0,
            power / np.maximum(util, 5.0),
            clock,
            tthr,
            pthr,
            node_temp,
            node_pfrac,
            temp - node_temp,
            pfrac - node_pfrac,
            *(rates[..., i] for i in range(RATE_COUNTERS)),
            heat,
        ],
        axis=-1,
    )
    feats[~valid] = np.nan
    return feats, valid


def bucket_recording(
    columns: dict[str, Any], static: dict[str, F64], previous: F64 | None, bucket_s: float
) -> tuple[npt.NDArray[np.int64], F64, F64]:
    """Bucket one recording chunk: (bucket ids, sums (buckets, nodes, gpus, CHANNELS), last counters).

    ``columns`` are the recording's arrays (steps, nodes, gpus) plus ``ts`` and ``report``; ``static``
    holds ``power_default_w`` and ``sm_clock_max_mhz`` as (nodes, gpus); ``previous`` the counters'
    last values from the chunk before (or None).
    """
    ts = np.asarray(columns["ts"], dtype=np.float64)
    shape = columns["temp_c"].shape
    raw = np.empty((*shape, len(RAW)))
    for i, name in enumerate(RAW):
        if name == TIME_FIELD:
            src = ts[:, None, None]
        elif name in static:
            src = static[name]
        else:
            src = columns[name]
        raw[..., i] = np.broadcast_to(src, shape)
    missing = ~columns["report"][:, :, None] | ~columns["present"].astype(bool)
    raw[missing] = np.nan
    counters = raw[..., 7:]
    prev = np.full(counters.shape[1:], np.nan) if previous is None else previous
    inc, last = counter_increase(counters, prev)
    ch = channels(raw, inc)
    bucket = np.floor(ts / bucket_s).astype(np.int64)
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]])
    return bucket[starts], np.add.reduceat(ch, starts, axis=0), last


def sliding_windows(bucket_ids: npt.NDArray[np.int64], sums: F64, width: int) -> tuple[F64, F64]:
    """Window sums ending at every bucket: (end bucket ids, sums) over ``width`` consecutive bucket ids
    (missing ids count as empty). Windows that are not yet full (the first ``width - 1``) are dropped."""
    first, last = int(bucket_ids[0]), int(bucket_ids[-1])
    dense = np.zeros((last - first + 1, *sums.shape[1:]))
    np.add.at(dense, bucket_ids - first, sums)
    csum = np.concatenate([np.zeros((1, *dense.shape[1:])), np.cumsum(dense, axis=0)])
    win = csum[width:] - csum[:-width]
    ends = np.arange(first + width - 1, last + 1, dtype=np.float64)
    return ends, win
