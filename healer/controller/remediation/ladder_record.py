"""A ladder in flight as stored in KV (``ladder.<incident id>``): its state and the step it waits on
(``healing`` walks it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from healer.controller.remediation import ladder


@dataclasses.dataclass(slots=True)
class Pending:
    """The step the ladder waits on, stored with its state."""

    kind: str
    """A ``ladder.StepKind``, or the rung's kind name."""
    reason: str = ""
    not_before: float = 0.0
    deadline: float | None = None
    soak_s: float = 0.0
    dcgm_level: int = 0
    action: int | None = None
    """Index of the step's action in the incident's actions; None until it is added."""
    reboot_requested: bool = False
    """(reboot_node) The scheduler took the reboot: now its ``reboot_status`` is polled."""

    @classmethod
    def of(cls, step: ladder.Step) -> Pending:
        not_before = step.not_before
        if step.kind is ladder.StepKind.VALIDATE:  # the quiet soak runs before the agent is asked
            not_before = max(not_before, step.state.updated_at + step.soak_s)
        return cls(step.kind, step.reason, not_before, step.deadline, step.soak_s, step.dcgm_level)


@dataclasses.dataclass(slots=True)
class Record:
    state: ladder.LadderState
    pending: Pending
    followers: list[str] = dataclasses.field(default_factory=list)
    """Incidents on the same node whose rule has the same ladder, opened while this one walks it: they
    follow it (one ladder per node: two ports down reboot the node once) and end as it ends."""

    def to_json(self) -> dict[str, Any]:
        pending = {f.name: getattr(self.pending, f.name) for f in dataclasses.fields(self.pending)}
        pending["kind"] = str(self.pending.kind)
        return {"state": self.state.to_json(), "pending": pending, "followers": list(self.followers)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Record:
        pending = dict(doc["pending"])
        pending["kind"] = ladder.step_kind(pending["kind"])
        followers = [str(f) for f in doc.get("followers", [])]
        return cls(ladder.LadderState.from_json(doc["state"]), Pending(**pending), followers)


HISTORY_PREFIX = "recoveries."
"""KV ``healer-state``: a GPU's earlier recoveries (``recoveries.<node>.<gpu index | node>``)."""


def history_key(node: str, gpu: int | None) -> str:
    return f"{HISTORY_PREFIX}{node}.{'node' if gpu is None else gpu}"
