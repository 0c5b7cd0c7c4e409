"""Statistics over peer groups, vectorised: each GPU's job as a small integer code (``codes``), and per
group the median, MAD and size of a reading (``group_median_mad``, by one sort, no loop over groups).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def codes(jobs: Sequence[str | None], valid: np.ndarray) -> tuple[np.ndarray, list[str]]:
    names: dict[str, int] = {}
    out = np.full(len(jobs), -1, dtype=np.int64)
    for i, job in enumerate(jobs):
        if job is not None and valid[i]:
            out[i] = names.setdefault(job, len(names))
    return out, list(names)


def group_median_mad(codes: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group code (>= 0): median, MAD and size of ``x``, by one sort (no loop over groups)."""
    k = int(codes.max()) + 1 if codes.size and codes.max() >= 0 else 0
    med, mad, size = np.full(k, np.nan), np.full(k, np.nan), np.zeros(k, dtype=np.int64)
    if k == 0:
        return med, mad, size
    m = codes >= 0
    c, v = codes[m], x[m]
    med = median_by(c, v, k)
    mad = median_by(c, np.abs(v - med[c]), k)
    size = np.bincount(c, minlength=k)
    return med, mad, size


def median_by(c: np.ndarray, v: np.ndarray, k: int) -> np.ndarray:
    order = np.lexsort((v, c))
    cs, vs = c[order], v[order]
    size = np.bincount(cs, minlength=k)
    start = np.concatenate(([0], np.cumsum(size)[:-1]))
    lo = start + (size - 1) // 2
    hi = start + size // 2
    out = np.full(k, np.nan)
    ok = size > 0
    out[ok] = (vs[lo[ok]] + vs[hi[ok]]) / 2
    return out


def node_lags(
    codes: np.ndarray, node: np.ndarray, m: np.ndarray, own: np.ndarray, deficit: float
) -> np.ndarray:
    """Per slot: the GPUs of its job on its node (those in ``m``) lag their own pasts (``own``: each
    one's deficit against its history) by ``deficit`` or more at the median, as a node slowed as a whole
    does, and the job's other nodes (where it has any in ``m``) do not share it: fewer than half of them
    lag their own pasts by half ``deficit`` at their median (a lag the job's peers share is the job's
    phase, not the node). By one sort over (job, node) pairs, no loop."""
    n = codes.size
    out = np.zeros(n, dtype=bool)
    m = m & (codes >= 0)
    if not m.any():
        return out
    width = int(node.max()) + 1
    keys, pair = np.unique(codes[m] * width + node[m], return_inverse=True)
    pair = pair.ravel()
    med = median_by(pair, own[m], keys.size)
    job = keys // width
    shares = (med >= deficit / 2).astype(np.float64)
    others = np.bincount(job)[job] - 1
    others_sharing = np.bincount(job, weights=shares)[job] - shares
    shared = (others >= 1) & (2 * others_sharing >= others)
    out[m] = ((med >= deficit) & ~shared)[pair]
    return out
