"""Each node against its peers at the same moment (``thermal.Step.peer_z``): a room-wide swing cancels.

Peers are the nodes that share the cause: the nodes of the same GPU model (a liquid H200's implied inlet
is its coolant's, an air A100's its room's) and, where the deployment says which cooling domain a node
sits in (``ThermalState.set_domains``: its rack, CDU or cooling loop), the nodes of that domain: the
same supply temperature and the same drift, so what they share cancels and one node's coolant or
inlet fault stands out. A domain with fewer than ``peer_min_nodes`` nodes with a value falls back to
the GPU model's nodes.
"""

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


def node_inlets(state: ThermalState, temp: F64, pt: F64, ok: BOOL, cls: npt.NDArray[np.intp]) -> F64:
    """Per node, the median over its steady busy GPUs of ``temp - r x power`` (``r`` the GPU's own
    from ``thermal_lag``; where the scorer learns those, only GPUs whose own is known count, else its
    class's on this fleet); nan with fewer than ``peer_min_gpus``."""
    n = len(temp)
    r = state.fleet_r[cls[:n]]
    if state.gpu_r is not None and state.gpu_r.shape == r.shape:  # its own step responses' slope
        r = np.where(np.isnan(state.gpu_r), r, state.gpu_r)
        # only GPUs whose own slope is known: in a fleet's first hour the trained slope is off by half
        # (the mixed fleet's liquid H200s), and two nodes at different loads then differ by 8-11 °C
        # (tuning seed 31, 12 nodes x 9 h: 11 °C in the first hour, 2 °C at most once known)
        ok = ok & ~np.isnan(state.gpu_r)
    implied = np.where(ok, temp - r * pt, np.nan)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        node_in: F64 = np.nanmedian(implied, axis=1)
    node_in[ok.sum(axis=1) < state.s.peer_min_gpus] = np.nan
    return node_in


def peer_groups(state: ThermalState, n: int, ncls: npt.NDArray[np.intp], have: BOOL) -> list[BOOL]:
    """The nodes compared together: per GPU model, each cooling domain with ``peer_min_nodes`` nodes
    with a value, then the model's other nodes (those without a domain, or in a domain too small)."""
    out: list[BOOL] = []
    dom = state.domain_index(n)
    for c in np.unique(ncls).tolist():
        rest = ncls == c
        for d in np.unique(dom[rest & (dom >= 0)]).tolist():
            mine = rest & (dom == d)
            if (mine & have).sum() >= state.s.peer_min_nodes:
                out.append(mine)
                rest = rest & ~mine
        if rest.any():
            out.append(rest)
    return out


def peer_z(
    state: ThermalState, n: int, temp: F64, pt: F64, ok: BOOL, cls: npt.NDArray[np.intp], dt: float
) -> F64:
    """Each node against its peers at this moment: its implied inlet (``node_inlets``: no fit of its
    own needed, so it holds from the first window and after any gap) less the median of the same over
    its peers (``peer_groups``), less the node's own slow offset from them; over an edge of ``peer_k``
    robust standard deviations of those nodes (at least ``peer_floor_c``). A room-wide swing moves
    every node and cancels. The offset follows over ``peer_tau_s``, ten times slower while the node is
    past ``freeze_at`` of its edge, so a coolant fault that builds over an hour is not absorbed."""
    s = state.s
    node_in = node_inlets(state, temp, pt, ok, cls)
    out: F64 = np.full(n, np.nan)
    raw: F64 = np.full(n, np.nan)
    ncls = cls[:n, 0] if cls.ndim == 2 else cls[:n]
    have_all = ~np.isnan(node_in)
    # peers share the cause: a node is compared with the nodes of its own GPU model (its cooling
    # domain's where known) only
    for mine in peer_groups(state, n, ncls, have_all):
        have = mine & have_all
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
            odd = np.abs(x) > s.freeze_at * edge
            rate = np.where(odd, alpha / 10.0, alpha)
            state.peer_off[:n][have] += (rate * x)[have]
        out[mine] = x[mine] / edge
        raw[mine] = x[mine]
    state.peer_c = raw
    return out
