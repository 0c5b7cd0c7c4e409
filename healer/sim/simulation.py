"""A Simulation: one fleet, its fault injector and its frame encoder, stepped together.

This is what every mode drives: ``record`` steps it as fast as it can and stores columns, ``live``
steps it once per interval and publishes frames, ``SimSource`` steps it for one node on demand. Order
within a step: the clock moves, due faults start (their events are stamped with the new time), then the
physics runs, so the first frame after a fault's start already shows it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from healer.sim import frames, injector, physics, step_reports


class Simulation:
    def __init__(
        self,
        fl: physics.Fleet,
        inj: injector.Injector,
        encoder: frames.Encoder,
        steps: step_reports.StepSource | None = None,
    ) -> None:
        self.fleet = fl
        self.injector = inj
        self.encoder = encoder
        self.steps = steps
        """The training jobs' step reports (the scenario's ``steps``), or None."""

    @property
    def t(self) -> float:
        return self.fleet.t

    def step(self, dt: float) -> None:
        self.fleet.t += dt
        self.injector.advance(self.fleet.t)
        self.fleet.physics(dt)

    def reporting(self) -> np.ndarray[Any, np.dtype[np.intp]]:
        """Indices of the nodes whose agent is alive (silent nodes send nothing)."""
        return np.flatnonzero(~self.fleet.silent)

    def take_report(self) -> tuple[np.ndarray[Any, np.dtype[np.intp]], np.ndarray[Any, np.dtype[np.int64]]]:
        """The reporting nodes of this step and every node's frame ``seq``; advances their ``seq``."""
        nodes = self.reporting()
        seq = self.fleet.seq.copy()
        self.fleet.seq[nodes] += 1
        return nodes, seq

    def frames(self) -> list[tuple[int, bytes]]:
        """One NodeFrame (JSON bytes) per reporting node for the current step; advances ``seq``."""
        fl = self.fleet
        nodes, seq = self.take_report()
        boot_ids = [fl.boot_id(i) for i in range(fl.nodes)]
        return self.encoder.encode(fl.columns(), nodes, seq, boot_ids, fl.t, fl.ports)

    def take_events(self) -> list[dict[str, Any]]:
        """NodeEvents (wire dicts) raised since the last call; silent nodes' events are lost."""
        silent = self.fleet.silent
        names = self.fleet.node_names
        index = {name: i for i, name in enumerate(names)} if silent.any() else {}
        out = self.fleet.take_events()
        if index:
            out = [e for e in out if not silent[index[e["node"]]]]
        return out

    def take_truth(self) -> list[dict[str, Any]]:
        return self.injector.take_truth()
