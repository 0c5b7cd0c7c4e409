"""Each node against its peers at the same moment (``thermal.Step.peer_z``): a room-wide swing cancels."""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from healer.anomaly.thermal import ThermalState

F64 = npt.NDArray[np.float64]
BOOL = npt.NDArray[np.bool_]


def peer_z(
    state: ThermalState, n: int, temp: F64, pt: F64, ok: BOOL, cls: npt.NDArray[np.intp], dt: float
) -> F64:
    """Each node against its peers at this moment: the median over its steady busy GPUs of
    ``temp - r x power`` (``r`` the GPU's own from ``thermal_lag``, else its class's on this fleet; no
    fit of its own needed, so it holds from the first window and after any gap), less the fleet's
    median of the same over the nodes of its GPU model, less the node's own slow offset from its peers;
    over an edge of ``peer_k`` robust standard deviations of those nodes (at least ``peer_floor_c``). A
    room-wide swing moves every node and cancels."""
    s = state.s
    r = state.fleet_r[cls[:n]]
    if state.gpu_r is not None and state.gpu_r.shape == r.shape:  # its own step responses' slope
        r = np.where(np.isnan(state.gpu_r), r, state.gpu_r)
    implied = np.where(ok, temp - r * pt, np.nan)
    out: F64 = np.full(n, np.nan)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        node_in = np.nanmedian(implied, axis=1)
    node_in[ok.sum(axis=1) < s.peer_min_gpus] = np.nan
    # peers share the cause: a node is compared with the nodes of its own GPU model only (a liquid
    # H200's implied inlet is its coolant's, an air A100's its room's: 10 °C apart on the mixed fleet)
    ncls = cls[:n, 0] if cls.ndim == 2 else cls[:n]
    for c in np.unique(ncls).tolist():
        mine = ncls == c
        have = mine & ~np.isnan(node_in)
        if have.sum() < s.peer_min_nodes:
            continue
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            x = np.where(mine, node_in - np.nanmedian(node_in[have]) - state.peer_off[:n], np.nan)
            x = x - np.nanmedian(x[have])
            mad = 1.4826 * float(np.nanmedian(np.abs(x[have])))
        edge = max(s.peer_floor_c, s.peer_k * mad)
        if dt > 0:
            alpha = 1.0 - math.exp(-dt / s.peer_tau_s)
            state.peer_off[:n][have] += alpha * x[have]
        out[mine] = x[mine] / edge
    return out
