"""What the controller believes about who sent a message and which nodes exist (DESIGN §8).

Three checks stand between the bus and the fleet state, before anything is allocated:

- **Identity comes from the subject.** nats-server's permissions guarantee that only node ``N`` publishes
  on ``healer.telemetry.N`` and ``healer.events.N``; the body's ``node`` is only a claim. A frame or
  event whose body names another node is rejected (reason ``identity_mismatch``), never acted on.
- **The fleet is what the operator admits** (``controller.admission``): the scheduler's node list, an
  inventory file, or, by explicit setting, any name that reports. A name not admitted is dropped
  (``unknown_node``) and never counts toward the breaker's fleet size. A node may report at most
  ``max_gpus_per_node`` GPUs (``too_many_gpus``), so one frame cannot widen the fleet state.
- **The topology comes with the fleet** (``controller.topology``, #27): the inventory file's labels, or
  the scheduler's node labels and Slurm node features, give each admitted node its failure domains
  (rack, switch, ...), read in the same call that admits it; ``controller.topology_file`` (Slurm's
  ``topology.conf``) adds the switch tree. ``topology()`` is the topology of the admitted fleet only.
- **Time comes from the controller's clock.** A node's ``ts`` further than ``max_clock_skew_s`` from the
  receive time is counted as skewed; the message is still used, but ordering, freshness, silence and
  quiet periods are judged on receive time everywhere, so a bad clock neither silences nor replays a node.

Rejections are counted in ``healer_controller_messages_rejected_total{kind, reason}`` (node names are
never labels: they are unbounded) and logged as ``controller.message_rejected`` at most once per
``LOG_EVERY_S`` per (kind, reason), with the number of rejections left unlogged in between.
"""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal

from healer import config, errors, logs
from healer.actuators import base as actuators
from healer.controller.inventory import topology
from healer.controller.observability import metrics
from healer.schemas import events, framecols, telemetry

Reason = Literal["identity_mismatch", "unknown_node", "too_many_gpus"]
Kind = Literal["frame", "event", "command_result"]

LOG_EVERY_S = 10.0
"""At most one ``controller.message_rejected`` log line per (kind, reason) this often."""
MAX_PENDING = 4096
"""Names waiting for the scheduler's answer (``admission: scheduler``), at most; more are dropped."""
REFUSED_FOR_S = 600.0
"""A name the scheduler did not list is not asked about again for this long."""


def read_inventory(path: str) -> set[str]:
    """Node names from the inventory file (``topology.read_inventory`` also gives their domains)."""
    return topology.read_inventory(path).names


class Admission:
    """The checks above, for one controller. ``frame_ok`` / ``event_ok`` decide and count; ``refresh``
    (housekeeping) asks the scheduler or re-reads the inventory file."""

    def __init__(
        self,
        cs: config.ControllerSettings,
        metrics: metrics.ControllerMetrics,
        *,
        scheduler: object,
        log: Any,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cs = cs
        self.metrics = metrics
        self.log = log
        self.clock = clock
        self.admitted: set[str] = set()
        self.pending: set[str] = set()
        """Names that reported and wait for the scheduler's answer."""
        self.refused: dict[str, float] = {}
        self.throttle = logs.Throttle(LOG_EVERY_S)
        self._asked_at = -float("inf")
        self._inventory_sig: tuple[float, int] | None = None
        self.domains: dict[str, dict[str, str]] = {}
        """Failure domains by node, from the inventory file or the scheduler's labels."""
        self._version = 0
        self._believed: tuple[tuple[int, ...], topology.Topology] | None = None
        self.switches: dict[str, dict[str, str]] = {}
        """Failure domains by node from ``topology_file`` (Slurm's switch tree)."""
        self._topology_sig: tuple[float, int] | None = None
        self.source: actuators.LabelSource | None = None
        if cs.admission == "scheduler":
            if not isinstance(scheduler, actuators.LabelSource):
                raise errors.PermanentError(
                    f"controller.admission is 'scheduler' but the {cs.actuator!r} actuator lists no nodes:"
                    " use the slurm or kubernetes actuator, admission 'file' with controller.inventory_file,"
                    " or (development only) admission 'first-seen'"
                )
            self.source = scheduler
        elif cs.admission == "file":
            if not cs.inventory_file:
                raise errors.PermanentError(
                    "controller.admission is 'file' but controller.inventory_file is unset"
                )
            self._reload_file()
        if cs.topology_file:
            self._reload_topology()
        self.metrics.nodes_admitted.set(len(self.admitted))

    @property
    def gpu_limit(self) -> int:
        """GPUs a node may report: ``max_gpus_per_node``, never fewer than ``gpus_per_node``."""
        return max(self.cs.max_gpus_per_node, self.cs.gpus_per_node)

    # -- decisions ---------------------------------------------------------------------------------
    def admits(self, node: str) -> bool:
        if node in self.admitted:
            return True
        if self.cs.admission == "first-seen":
            self.admitted.add(node)
            self.metrics.nodes_admitted.set(len(self.admitted))
            return True
        if (
            self.source is not None
            and node not in self.pending
            and len(self.pending) < MAX_PENDING
            and self.clock() - self.refused.get(node, -float("inf")) >= REFUSED_FOR_S
        ):
            self.pending.add(node)
        return False

    def frame_ok(self, subject_node: str, frame: telemetry.FrameView) -> bool:
        """True when the frame may be ingested (its identity matches, its node is admitted, its GPUs fit).
        The caller counts clock skew (``check_skew``) on the frames it ingests."""
        if frame.node != subject_node:
            return self.reject("frame", "identity_mismatch", subject_node, claimed=frame.node)
        if not self.admits(subject_node):
            return self.reject("frame", "unknown_node", subject_node)
        limit = self.gpu_limit
        if isinstance(frame, framecols.Frame):  # the controller's (its GPUs are not objects)
            count, top = frame.gpu_count, frame.max_index
        else:
            count, top = len(frame.gpus), max((g.index for g in frame.gpus), default=-1)
        if count > limit or (frame.gpus_expected or 0) > limit or top >= limit:
            return self.reject("frame", "too_many_gpus", subject_node, gpus=count, limit=limit)
        return True

    def event_ok(self, subject_node: str, event: events.NodeEvent, now: float) -> bool:
        if event.node != subject_node:
            return self.reject("event", "identity_mismatch", subject_node, claimed=event.node)
        if not self.admits(subject_node):
            return self.reject("event", "unknown_node", subject_node)
        if event.gpu_index is not None and event.gpu_index >= self.gpu_limit:
            return self.reject("event", "too_many_gpus", subject_node, gpu_index=event.gpu_index)
        self.check_skew("event", event.ts, now)
        return True

    def waiting(self, node: str) -> bool:
        """The scheduler has not been asked about this name yet (its durable events wait for the answer)."""
        return node in self.pending

    def check_skew(self, kind: Kind, ts: float, now: float) -> bool:
        """Count a ``ts`` further than ``max_clock_skew_s`` from ``now``; True when within."""
        if abs(now - ts) <= self.cs.max_clock_skew_s:
            return True
        self.metrics.clock_skewed.labels(kind).inc()
        return False

    def reject(self, kind: Kind, reason: Reason, node: str, count: int = 1, **detail: Any) -> bool:
        """Count (``count`` tallied elsewhere, or one) and log at a bounded rate; False, for ``return``."""
        self.metrics.messages_rejected.labels(kind, reason).inc(count)
        if self.throttle.allow((kind, reason)):
            self.log.warning(
                "controller.message_rejected", kind=kind, reason=reason, node=node,
                suppressed=self.throttle.take_suppressed((kind, reason)), **detail,
            )  # fmt: skip
        return False

    # -- inventory ---------------------------------------------------------------------------------
    async def refresh(self) -> None:
        """Housekeeping: re-read the inventory file when it changed; ask the scheduler about the names
        that reported and are not admitted (one call, at most every ``admission_refresh_s``)."""
        if self.cs.topology_file:
            self._reload_topology()
        if self.cs.admission == "file":
            self._reload_file()
            return
        if self.source is None or not self.pending:
            return
        now = time.monotonic()
        if now - self._asked_at < self.cs.admission_refresh_s:
            return
        self._asked_at = now
        asked = sorted(self.pending)
        try:
            listed = await asyncio.wait_for(self.source.node_labels(asked), self.cs.labels_timeout_s)
        except (errors.HealerError, TimeoutError) as e:
            self.metrics.label_refresh_failures.inc()
            self.log.warning("controller.admission_failed", error=str(e) or repr(e), waiting=len(asked))
            return
        self.admit(listed)
        self.learn_domains(listed)
        wall = self.clock()
        for name in asked:
            self.pending.discard(name)
            if name not in self.admitted:
                self.refused[name] = wall
        if len(self.refused) > MAX_PENDING:
            for name in sorted(self.refused, key=self.refused.__getitem__)[: len(self.refused) - MAX_PENDING]:
                del self.refused[name]
        self.log.info("controller.admission_refreshed", asked=len(asked), admitted=len(self.admitted))

    def admit(self, names: Iterable[str]) -> None:
        self.admitted.update(names)
        self.metrics.nodes_admitted.set(len(self.admitted))

    def learn_domains(self, labels: dict[str, dict[str, str]]) -> None:
        """Domains from the scheduler's labels of admitted nodes (admission and the label refresh)."""
        if self.cs.admission == "file":
            return  # the inventory file's labels are the topology
        for node, node_labels in labels.items():
            if node in self.admitted:
                self.domains[node] = topology.domains_from_scheduler(
                    node_labels, self.cs.domain_labels, self.cs.domain_features
                )
        self._changed()

    def topology(self) -> topology.Topology:
        """The failure domains of the admitted fleet: the source's labels, then the switch tree. Built
        once per change of what it is made of (``_changed``), not once per call: a burst asks it for
        every node it takes out (#43), and at 10,000 nodes building it is ~20 ms. Treat it as read-only."""
        key = (
            self._version, id(self.admitted), len(self.admitted), id(self.domains), len(self.domains),
            id(self.switches), len(self.switches),
        )  # fmt: skip
        if self._believed is not None and self._believed[0] == key:
            return self._believed[1]
        believed = topology.Topology({n: self.domains.get(n, {}) for n in self.admitted})
        for node, switches in self.switches.items():
            if node in self.admitted:
                believed.update(node, switches)
        self._believed = (key, believed)
        return believed

    def _changed(self) -> None:
        """Something ``topology`` is made of changed in place: build it again on the next call."""
        self._version += 1

    def _reload_topology(self) -> None:
        assert self.cs.topology_file
        try:
            st = pathlib.Path(self.cs.topology_file).stat()
            sig = (st.st_mtime, st.st_size)
            if sig == self._topology_sig:
                return
            parsed = topology.read_topology_file(self.cs.topology_file)
        except (OSError, errors.PermanentError) as e:
            if self._topology_sig is None:
                raise errors.PermanentError(f"cannot read controller.topology_file: {e}") from e
            self.log.warning("controller.topology_unreadable", error=str(e), kept=len(self.switches))
            return
        for problem in parsed.problems:
            self.metrics.topology_problems.inc()
            self.log.warning("controller.topology_line_rejected", problem=problem)
        self._topology_sig = sig
        self.switches = parsed.domains
        self._changed()
        self.log.info("controller.topology_loaded", nodes=len(parsed.domains), rejected=len(parsed.problems))

    def _reload_file(self) -> None:
        assert self.cs.inventory_file
        try:
            st = pathlib.Path(self.cs.inventory_file).stat()
        except OSError as e:
            if self._inventory_sig is None:
                raise errors.PermanentError(f"cannot read controller.inventory_file: {e}") from e
            self.log.warning("controller.inventory_unreadable", error=str(e), kept=len(self.admitted))
            return
        sig = (st.st_mtime, st.st_size)
        if sig == self._inventory_sig:
            return
        try:
            inventory = topology.read_inventory(self.cs.inventory_file)
        except errors.PermanentError as e:
            if self._inventory_sig is None:
                raise
            self.log.warning("controller.inventory_rejected", error=str(e), kept=len(self.admitted))
            return
        self._inventory_sig = sig
        self.admitted = inventory.names
        self.domains = inventory.domains
        self._changed()
        self.metrics.nodes_admitted.set(len(self.admitted))
        self.log.info("controller.inventory_loaded", nodes=len(inventory.names))
