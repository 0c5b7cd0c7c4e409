"""The rule engine's per-rule state (a ``Track``: each target's state, since, fired at, cooldown and rearm
as (nodes, targets) arrays), sized to the fleet and its match mask kept current."""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from healer.rules import ruleset
from healer.rules import state as fleet_state
from healer.schemas import fields


@dataclasses.dataclass(slots=True)
class Track:
    state: npt.NDArray[np.int8]
    since: npt.NDArray[np.float64]
    fired_at: npt.NDArray[np.float64]
    cool_until: npt.NDArray[np.float64]
    rearm: npt.NDArray[np.bool_]
    """Ended while the condition still held: may not start again until the condition is seen false."""
    mask_version: int = -1
    mask: npt.NDArray[np.bool_] | None = None
    busy: bool = True
    """Some target is pending, firing or resolving (False lets a quiet rule skip the state machine)."""


def width(rule: ruleset.Rule, st: fleet_state.FleetState) -> int:
    """Targets per node row: the GPU slots, the port slots, or 1 (the node)."""
    if rule.scope == fields.Scope.GPU:
        return st.gpus
    return st.ports.slots if rule.scope == fields.Scope.PORT else 1


def track_for(tracks: dict[str, Track], rule: ruleset.Rule, width: int, st: fleet_state.FleetState) -> Track:
    """The rule's track, made (or grown with the fleet, keeping what it knew) to ``(st.cap, width)``, its
    match mask current."""
    track = tracks.get(rule.id)
    if track is None or track.state.shape != (st.cap, width):
        fresh = Track(
            np.zeros((st.cap, width), dtype=np.int8),
            np.zeros((st.cap, width)),
            np.zeros((st.cap, width)),
            np.full((st.cap, width), -np.inf),
            np.zeros((st.cap, width), dtype=bool),
        )
        if track is not None:  # the fleet grew: keep what we knew
            rows, cols = track.state.shape
            for name in ("state", "since", "fired_at", "cool_until", "rearm"):
                getattr(fresh, name)[:rows, :cols] = getattr(track, name)
        track = tracks[rule.id] = fresh
    if track.mask_version != st.version:
        track.mask = None if rule.match.everything else match_mask(rule, width, st)
        track.mask_version = st.version
    return track


def match_mask(rule: ruleset.Rule, width: int, st: fleet_state.FleetState) -> npt.NDArray[np.bool_]:
    """The targets the rule's ``match`` selects (node name and labels, GPU model)."""
    mask = np.zeros((st.cap, width), dtype=bool)
    for i, name in enumerate(st.names):
        if not rule.match.node_ok(name, st.labels[i]):
            continue
        if rule.scope != fields.Scope.GPU:
            models = [m for m, _ in st.gpu_info[i].values()]
            mask[i] = rule.match.model is None or any(rule.match.model_ok(m) for m in models)
        elif rule.match.model is None:
            mask[i] = True
        else:
            for g, (model, _) in st.gpu_info[i].items():
                mask[i, g] = rule.match.model_ok(model)
    return mask
