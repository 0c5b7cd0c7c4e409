"""The faults a fail-slow evaluation injects and the tally of what the scorer named against them, per
window: shared by the run on the independent generator (``straggler_eval``) and the run on healer's own
simulator (``straggler_sim_eval``), so neither imports the other.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Final

EPISODE_S = 3600.0
JOB_LEVEL_KINDS: Final = frozenset({"job_slowdown"})
"""Faults with no culprit GPU or node (every rank waits alike): naming anyone is wrong."""


@dataclasses.dataclass
class Fault:
    """One injected fault; every time is in seconds from the run's start (None: did not happen)."""

    kind: str
    node: int
    gpu: int | None
    drawn_at: float
    """When the fault starts in the hardware: drawn uniformly in the run, whatever runs on the GPU (the
    old counting's onset)."""
    magnitude: float
    onset_at: float | None = None
    """When it starts to slow a job: the first sample at or after ``drawn_at`` at which the faulty GPU's
    job (a node fault: any job on the node) computes, by the fleet's own job state (the generator's
    training phase, the simulator's job outside checkpoints and pauses), not by healer's load threshold.
    A fail-slow fault is one that makes a job slow; before a job computes on the GPU it slows nothing
    and no telemetry can show it."""
    loaded_at: float | None = None
    """The faulty GPU's (node's first GPU's) first loaded sample (``LOAD_UTIL_PCT``) at or after
    ``drawn_at``: the scorer's own notion of load (a diagnostic)."""
    found_at: float | None = None
    """When the scorer first named it (a job-level fault: when step times first showed the job slower)."""
    wrongly_named: int = 0
    """A job-level fault (no culprit GPU): windows in which a GPU or node of its node was named."""


class Tally:
    """Each window's newly confirmed stragglers against the plan: a fault named (``found_at``), a job-level
    fault's node named (``wrongly_named``), or a false straggler episode (one per GPU or node per hour,
    as the ``gpu-straggler`` rule's cooldown makes it) on a node with no fault."""

    def __init__(self, plan: list[Fault]) -> None:
        self.plan = plan
        self.episodes = 0
        self.job_level_false = 0
        """Job-level slowdowns reported for a job with no fault (healer's simulator: step times)."""
        self._last: dict[tuple[str, int | None], float] = {}
        self._before: set[tuple[str, int | None]] = set()

    def window(self, t: float, confirmed: set[tuple[str, int | None]]) -> None:
        for key in confirmed - self._before:
            node_i = int(key[0][1:])
            fault = next((f for f in self.plan if f.node == node_i and t >= f.drawn_at), None)
            if fault is not None and fault.kind in JOB_LEVEL_KINDS:
                fault.wrongly_named += 1
            elif fault is not None and _names(fault, key):
                if fault.found_at is None:
                    fault.found_at = t
            elif fault is None and t - self._last.get(key, -math.inf) >= EPISODE_S:
                self.episodes += 1
                self._last[key] = t
            # else: another GPU of a faulty node, not counted as healthy
        self._before = confirmed


def _names(fault: Fault, key: tuple[str, int | None]) -> bool:
    if fault.gpu is None:
        return True  # a node fault: the node, or any of its GPUs (the rule folds them into one node incident)
    return key[1] == fault.gpu
