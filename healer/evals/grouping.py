"""The controller's node-wide grouping of anomaly firings, for backtests: what an SRE is sent.

The controller (``correlation.correlate``) lets a GPU firing of a ``node_wide`` rule join its
node's open incident of the same group when that incident is node-wide already, or opened less than
``within_s`` ago; otherwise the firing opens an incident of its own. An incident becomes node-wide once
``NodeWide.threshold(gpus)`` of its node's GPUs have joined it, and it stays open while any of its GPUs'
firings is open (each GPU's hysteresis: ``backtest._Tracker``). ``NodeGrouper`` replays that for one
rule, so a backtest counts incidents as the controller opens them beside the raw GPU firings.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass
class Group:
    """One controller incident: the node, when it opened, the GPUs that joined it."""

    node: str
    opened_at: float
    gpus: set[int]
    open_gpus: set[int]
    node_wide: bool = False


class NodeGrouper:
    """Per node, the open incidents GPU firings join (``join``) and leave (``leave``)."""

    def __init__(
        self, *, gpus_per_node: int = 8, fraction: float = 0.5, min_gpus: int = 2, within_s: float = 120.0
    ):
        self.need = max(min_gpus, math.ceil(fraction * gpus_per_node - 1e-9))
        self.within_s = within_s
        self.open: dict[str, list[Group]] = {}
        self.opened: list[Group] = []
        """Every incident opened, in order."""

    def join(self, node: str, gpu: int, at: float) -> Group | None:
        """A GPU firing opens at ``at``: the new incident it opens, or None when it joined one."""
        mine = [g for g in self.open.get(node, []) if g.node_wide or 0 <= at - g.opened_at < self.within_s]
        if mine:
            g = max(mine, key=lambda g: (g.node_wide, g.opened_at))
            g.gpus.add(gpu)
            g.open_gpus.add(gpu)
            g.node_wide = g.node_wide or len(g.gpus) >= self.need
            return None
        g = Group(node, at, {gpu}, {gpu})
        self.open.setdefault(node, []).append(g)
        self.opened.append(g)
        return g

    def leave(self, node: str, gpu: int) -> None:
        """A GPU's firing resolved: the incidents it held close once none of their GPUs is open."""
        groups = self.open.get(node, [])
        for g in groups:
            g.open_gpus.discard(gpu)
        self.open[node] = [g for g in groups if g.open_gpus]
