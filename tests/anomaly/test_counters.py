"""Error counters against the fleet's own background: a burst is not an anomaly, a rate that holds is."""

from __future__ import annotations

import numpy as np

from healer.anomaly import counters


def test_a_burst_reads_nothing_and_a_rising_rate_reads_one_window_late() -> None:
    hold = counters.Persistence(gpus=2, lookback=10)
    out = []
    for k in range(40):
        v = np.zeros((1, 2))
        # GPU 0: an SBE burst, in the window for 10 instants (5 minutes at 30 s), then gone
        v[0, 0] = 8.0 if 5 <= k < 15 else 0.0
        # GPU 1: an NVLink whose CRC rate climbs from instant 10
        v[0, 1] = max(0.0, (k - 10) * 0.5)
        out.append(hold.step(v)[0])
    got = np.array(out)
    assert got[:, 0].max() == 0.0
    assert got[:20, 1].max() == 0.0  # its first window: not judged yet
    assert got[-1, 1] == (39 - 10 - 10) * 0.5  # the rate a window ago: it holds
    # a node that appears later starts unjudged, the others keep their history
    v = np.full((2, 2), 3.0)
    np.testing.assert_array_equal(hold.step(v), [[0.0, 3.0], [0.0, 0.0]])
