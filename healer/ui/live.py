"""What the browser receives: one snapshot when it connects, then small changes, over server-sent events.

The map is columnar and compact: the cells (nodes x GPUs, rows in ``nodes`` order) travel as two base64
byte arrays, the temperature in whole degrees and a health code, so 10,000 x 8 GPUs is about 215 kB before
gzip. After that a ``cells`` message every ``push_s`` carries only the cells whose health changed or
whose temperature moved by ``temp_deadband_c`` or more since the browser last heard (a fleet's noise
would otherwise resend most cells every second); a change of layout (a new node, a new group) sends a
fresh snapshot instead. Incident changes, feed lines and safety changes go out as they happen.

Every node the page knows of is on the map from the first snapshot: those that sent frames, those with an
incident, and the admitted fleet (``admitted``: the controller's admission when the page runs inside it,
else ``controller.inventory_file``), the silent ones drawn silent (grey). They are grouped by their
labels: those of their incidents, and the failure domains (``label_source``: the controller's own
topology when the page runs inside it, else the inventory file and ``topology.conf``). Node marks
(cordoned, drained, excluded) travel with the snapshot and, when they change, with the next ``cells`` message.

Each browser has a bounded queue: one that cannot keep up is disconnected (its ``EventSource``
reconnects by itself and starts again from a snapshot), so a slow client never grows this process.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from healer.ui import board, fleet

HEALTH_OK = 0
HEALTH_GPU_MISSING = 5
HEALTH_NODE_SILENT = 6
HEALTH_NO_GPU = 7
"""A cell past the node's expected GPU count (drawn empty)."""

CLIENT_QUEUE = 256
ADMITTED_EVERY_S = 10.0
"""How often the admitted fleet is asked for new names (a set difference over the whole fleet)."""


@dataclasses.dataclass(eq=False)
class Client:
    queue: asyncio.Queue[bytes | None] = dataclasses.field(
        default_factory=lambda: asyncio.Queue(maxsize=CLIENT_QUEUE)
    )
    dropped: bool = False


def sse(event: str, payload: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _b64(arr: npt.NDArray[np.uint8]) -> str:
    return base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode()


class Live:
    """The fleet and the board, turned into messages for every connected browser."""

    def __init__(
        self,
        fleet: fleet.Fleet,
        board: board.Board,
        *,
        group_by: tuple[str, ...] = ("rack", "partition"),
        stale_after_s: float = 30.0,
        temp_deadband_c: int = 2,
        title: str = "healer",
        admitted: Callable[[], Iterable[str]] | None = None,
        links: dict[str, str | None] | None = None,
    ) -> None:
        self.fleet = fleet
        self.board = board
        self.group_by = group_by
        self.stale_after_s = stale_after_s
        self.deadband = temp_deadband_c
        self.title = title
        self.clients: set[Client] = set()
        self.extra_labels: dict[str, dict[str, str]] = {}
        """Labels from a file or from the controller (``healer.ui.server``), beside those from incidents."""
        self.static_labels: dict[str, dict[str, str]] = {}
        """(with ``label_source``) The labels read from files (``server.page_labels``), which win."""
        self.label_source: Callable[[], Mapping[str, Mapping[str, str]]] | None = None
        """The controller's failure domains by node (its ``Admission.topology()``: inventory, scheduler
        labels and features, ``topology.conf``), asked every ``ADMITTED_EVERY_S`` into ``extra_labels``."""
        self._labels_at = -float("inf")
        self._sent_temp: npt.NDArray[np.uint8] = np.zeros((0, fleet.gpus), np.uint8)
        self._sent_health: npt.NDArray[np.uint8] = np.zeros((0, fleet.gpus), np.uint8)
        self._sent_layout: tuple[int, tuple[tuple[str, tuple[int, ...]], ...]] | None = None
        self.stats = {"frames": 0, "sent_bytes": 0, "clients_dropped": 0}
        self.admitted = admitted
        self._admitted_at = -float("inf")
        self.links = links or {}
        """Link templates for the page (``grafana``: ``ui.grafana_url``), ``None`` when unset."""
        self._sent_marks: dict[str, list[str]] | None = None

    def sync_nodes(self, now: float | None = None) -> None:
        """Put on the map the nodes with an open incident and, every ``ADMITTED_EVERY_S``, the admitted
        fleet, before any frame of theirs."""
        f = self.fleet
        missing = {
            s.data.node
            for s in self.board.open.values()
            if s.data.node not in f.index and s.data.node != board.FLEET_NODE and s.data.domain is None
        }  # a domain incident's node (``switch.leaf-07``) is no node: it is drawn over its members
        now = time.time() if now is None else now
        if self.admitted is not None and now - self._admitted_at >= ADMITTED_EVERY_S:
            self._admitted_at = now
            missing.update(n for n in self.admitted() if n not in f.index)
        if missing:
            f.declare(missing)
        if self.label_source is not None and now - self._labels_at >= ADMITTED_EVERY_S:
            self._labels_at = now
            live = self.label_source()
            fixed = self.static_labels
            self.extra_labels = {n: {**live.get(n, {}), **fixed.get(n, {})} for n in {*live, *fixed}}

    # --- the picture -------------------------------------------------------------------------------

    def groups(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Rows grouped by the first of ``group_by`` labels a node has (sorted), else one group."""
        by: dict[str, list[int]] = {}
        for row, name in enumerate(self.fleet.names):
            labels = {**self.board.node_labels.get(name, {}), **self.extra_labels.get(name, {})}
            key = next((f"{k}={labels[k]}" for k in self.group_by if k in labels), "")
            by.setdefault(key, []).append(row)
        if list(by) == [""]:
            return (("fleet", tuple(by[""])),)
        return tuple(
            (k or "unlabelled", tuple(v)) for k, v in sorted(by.items(), key=lambda kv: (kv[0] == "", kv[0]))
        )

    def health(self, now: float) -> npt.NDArray[np.uint8]:
        f = self.fleet
        n, g = len(f.names), f.gpus
        out = np.zeros((n, g), np.uint8)
        for shown in self.board.open.values():
            d = shown.data
            row = f.index.get(d.node)
            if row is None:
                continue
            code = board.SEVERITY_CODE.get(d.severity, 1)
            if d.gpu_index is None:
                out[row] = np.maximum(out[row], code)
            elif 0 <= d.gpu_index < g:
                out[row, d.gpu_index] = max(int(out[row, d.gpu_index]), code)
        cols = np.arange(g)[None, :]
        beyond = cols >= f.expected[:n, None]
        missing = ~f.present[:n] & ~beyond
        out[missing] = np.maximum(out[missing], HEALTH_GPU_MISSING)
        out[beyond & ~f.present[:n]] = HEALTH_NO_GPU
        silent = (now - f.seen_at[:n]) > self.stale_after_s
        out[silent] = HEALTH_NODE_SILENT
        return out

    def snapshot(self, now: float | None = None, *, rebase: bool = False) -> dict[str, Any]:
        """Everything the page shows. ``rebase``: every browser gets this one (later changes are
        computed against it); a browser that joins gets one without disturbing the others' baseline."""
        now = time.time() if now is None else now
        self.sync_nodes(now)
        temps, health = self.fleet.temps_u8(), self.health(now)
        groups = self.groups()
        marks = self.board.node_marks()
        if rebase or self._sent_layout is None:
            self._sent_temp, self._sent_health = temps, health
            self._sent_layout = (self.fleet.layout, groups)
            self._sent_marks = marks
        return {
            "title": self.title,
            "now": now,
            "gpus": self.fleet.gpus,
            "nodes": self.fleet.names,
            "groups": [[name, list(rows)] for name, rows in groups],
            "temp": _b64(temps),
            "health": _b64(health),
            "incidents": [s.as_json() for s in self.board.open.values()],
            "verdicts": {i: v for i, v in self.board.verdicts.items() if i in self.board.open},
            "recent": list(self.board.recent)[-100:],
            "safety": self.board.safety(),
            "excluded": sorted(self.board.exclusions),
            "marks": marks,
            "stale_after_s": self.stale_after_s,
            "links": self.links,
            "frames": self.fleet.frames,
        }

    def cells(self, now: float | None = None) -> tuple[str, dict[str, Any]] | None:
        """The next periodic message: ``("snapshot", ...)`` after a layout change, else ``("cells",
        ...)`` with what changed, or ``None`` when nothing did."""
        now = time.time() if now is None else now
        self.sync_nodes(now)
        if self._sent_layout != (self.fleet.layout, self.groups()):
            return "snapshot", self.snapshot(now, rebase=True)
        marks = self.board.node_marks()
        marks_changed = marks != self._sent_marks
        temps, health = self.fleet.temps_u8(), self.health(now)
        old_t = self._sent_temp.astype(np.int16)
        new_t = temps.astype(np.int16)
        moved = (np.abs(new_t - old_t) >= self.deadband) | ((old_t == 255) != (new_t == 255))
        changed = moved | (health != self._sent_health)
        flat = np.flatnonzero(changed)
        if flat.size == 0 and not marks_changed:
            return None
        self._sent_temp = np.where(changed, temps, self._sent_temp)
        self._sent_health = health
        out: dict[str, Any] = {
            "now": now,
            "i": flat.tolist(),
            "t": temps.ravel()[flat].tolist(),
            "h": health.ravel()[flat].tolist(),
            "frames": self.fleet.frames,
        }
        if marks_changed:
            self._sent_marks = marks
            out["marks"] = marks
        return "cells", out

    # --- the browsers ------------------------------------------------------------------------------

    def connect(self) -> tuple[Client, bytes]:
        """A new browser: its queue and the snapshot to send first."""
        first = not self.clients
        client = Client()
        self.clients.add(client)
        return client, sse("snapshot", self.snapshot(rebase=first))

    def disconnect(self, client: Client) -> None:
        self.clients.discard(client)

    def broadcast(self, event: str, payload: Any) -> None:
        if not self.clients:
            return
        msg = sse(event, payload)
        for client in list(self.clients):
            try:
                client.queue.put_nowait(msg)
            except asyncio.QueueFull:
                client.dropped = True
                self.stats["clients_dropped"] += 1
                self.clients.discard(client)
                while not client.queue.empty():
                    client.queue.get_nowait()
                client.queue.put_nowait(None)

    def tick(self, now: float | None = None) -> None:
        """The periodic push (``push_s``), with nothing to send when no browser is connected."""
        if not self.clients:
            return
        out = self.cells(now)
        if out is not None:
            self.broadcast(*out)
