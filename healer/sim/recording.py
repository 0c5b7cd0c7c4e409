"""Recordings: a simulated run stored as columns, fast to write, read back as the very same frames.

A recording is one zip file (numpy's ``.npz`` layout, so ``numpy.load`` opens its arrays):

- ``meta.json``: format version, node names, GPUs per node, the static GpuSample fields per GPU, run
  id, seed, scenario, interval, start time, and the list of chunks;
- ``c000000/<field>.npy`` ...: each dynamic field as an array (steps, nodes, gpus), already rounded the
  way frames round it (``job``: each GPU's job number, -1 none; absent from older recordings, whose frames
  then carry no ``jobs``), plus ``ts`` (steps,), ``report`` (steps, nodes: did the agent send a frame),
  ``seq`` and ``boot_no`` (steps, nodes);
- ``events.jsonl`` (NodeEvents in order) and ``truth.jsonl`` (ground truth, one fault per line).

``Recording.frames()`` rebuilds each step's NodeFrames with the same ``frames.Encoder`` the live
simulator uses, so a replay publishes exactly what a live run would have.
"""

from __future__ import annotations

import dataclasses
import io
import pathlib
import zipfile
from collections.abc import Iterator, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson

from healer import errors
from healer.schemas import telemetry
from healer.sim import frames, physics, simulation

FORMAT: Final = "healer-sim-recording/1"
TARGET_CHUNK_VALUES: Final = 2_000_000
"""GPU-steps per chunk (values per field): bounds memory while recording."""

_DTYPES: Final[dict[str, type[np.generic]]] = {
    "power_w": np.float32,
    "power_limit_w": np.float32,
    "energy_j": np.float64,
    **dict.fromkeys(frames.WHOLE_FIELDS, np.int32),
    **dict.fromkeys(frames.INT_FIELDS, np.int64),
    "clocks_event_reasons": np.int32,
    **dict.fromkeys((*frames.BOOL_FIELDS, "present"), np.bool_),
    frames.JOB_FIELD: np.int64,
}
_DECIMALS: Final = dict(frames.FLOAT_FIELDS)


def _stored(name: str, arr: npt.NDArray[Any]) -> npt.NDArray[Any]:
    if name in _DECIMALS:
        arr = np.round(arr, _DECIMALS[name])
    elif name in frames.WHOLE_FIELDS:
        arr = np.rint(arr)
    return arr.astype(_DTYPES[name])


def _write_npy(zf: zipfile.ZipFile, name: str, arr: npt.NDArray[Any]) -> None:
    with zf.open(name, "w", force_zip64=True) as f:
        np.lib.format.write_array(f, np.ascontiguousarray(arr), allow_pickle=False)


class Writer:
    """Appends steps of one simulation to a recording file."""

    def __init__(
        self,
        path: str | pathlib.Path,
        sim: simulation.Simulation,
        *,
        interval_s: float,
        extra_meta: dict[str, Any] | None = None,
        compresslevel: int = 1,
    ) -> None:
        fl = sim.fleet
        self._sim = sim
        self._zf = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=compresslevel)
        self._chunk_steps = max(1, TARGET_CHUNK_VALUES // (fl.nodes * fl.gpus))
        shape = (self._chunk_steps, fl.nodes, fl.gpus)
        self._buf = {name: np.zeros(shape, dtype=_DTYPES[name]) for name in frames.DYNAMIC_FIELDS}
        self._ts = np.zeros(self._chunk_steps)
        self._report = np.zeros(shape[:2], dtype=np.bool_)
        self._seq = np.zeros(shape[:2], dtype=np.int64)
        self._boot = np.zeros(shape[:2], dtype=np.int64)
        self._k = 0
        self._chunks: list[dict[str, Any]] = []
        self._events = io.BytesIO()
        self._truth = io.BytesIO()
        self.steps = 0
        self.frames = 0
        self.meta: dict[str, Any] = {
            "format": FORMAT,
            "node_names": fl.node_names,
            "gpus": fl.gpus,
            "static": frames.static_fields(fl.profiles, fl.uuids),
            "run_id": fl.run_id,
            "interval_s": interval_s,
            "start_ts": fl.t,
            "agent_version": sim.encoder.agent_version,
            **(extra_meta or {}),
        }

    def add_step(self) -> None:
        """Store the simulation's current state as one step (advances the frame ``seq``)."""
        sim, k = self._sim, self._k
        nodes, seq = sim.take_report()
        for name, arr in sim.fleet.columns().items():
            self._buf[name][k] = _stored(name, arr)
        self._ts[k] = sim.t
        self._report[k] = False
        self._report[k, nodes] = True
        self._seq[k] = seq
        self._boot[k] = sim.fleet.boot_no
        self._k += 1
        self.steps += 1
        self.frames += len(nodes)
        if self._k == self._chunk_steps:
            self._flush()

    def add_events(self, evts: Sequence[dict[str, Any]]) -> None:
        for e in evts:
            self._events.write(orjson.dumps(e) + b"\n")

    def add_truth(self, records: Sequence[dict[str, Any]]) -> None:
        for r in records:
            self._truth.write(orjson.dumps(r) + b"\n")

    def _flush(self) -> None:
        k = self._k
        if not k:
            return
        prefix = f"c{len(self._chunks):06d}"
        for name, buf in self._buf.items():
            _write_npy(self._zf, f"{prefix}/{name}.npy", buf[:k])
        for name, buf in (
            ("ts", self._ts),
            ("report", self._report),
            ("seq", self._seq),
            ("boot_no", self._boot),
        ):
            _write_npy(self._zf, f"{prefix}/{name}.npy", buf[:k])
        self._chunks.append({"prefix": prefix, "steps": k})
        self._k = 0

    def close(self) -> None:
        self._flush()
        self.meta["chunks"] = self._chunks
        self.meta["steps"] = self.steps
        self._zf.writestr("events.jsonl", self._events.getvalue())
        self._zf.writestr("truth.jsonl", self._truth.getvalue())
        self._zf.writestr("meta.json", orjson.dumps(self.meta))
        self._zf.close()


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    ts: float
    nodes: npt.NDArray[np.intp]
    """Indices of the nodes that sent a frame."""
    seq: npt.NDArray[np.int64]
    boot_ids: list[str]
    columns: dict[str, npt.NDArray[Any]]


class Recording:
    """A recording opened for reading."""

    def __init__(self, path: str | pathlib.Path) -> None:
        self.path = pathlib.Path(path)
        try:
            self._zf = zipfile.ZipFile(self.path)
            self.meta: dict[str, Any] = orjson.loads(self._zf.read("meta.json"))
        except (OSError, zipfile.BadZipFile, KeyError, orjson.JSONDecodeError) as e:
            raise errors.PermanentError(f"{self.path} is not a readable simulator recording: {e}") from e
        if self.meta.get("format") != FORMAT:
            raise errors.PermanentError(
                f"{self.path}: format {self.meta.get('format')!r}, expected {FORMAT!r}"
            )
        self.node_names: list[str] = self.meta["node_names"]

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._zf.close()

    def _load(self, name: str) -> npt.NDArray[Any]:
        with self._zf.open(name) as f:
            arr: npt.NDArray[Any] = np.lib.format.read_array(f, allow_pickle=False)
            return arr

    def chunks(self, fields: Sequence[str] = frames.DYNAMIC_FIELDS) -> Iterator[dict[str, npt.NDArray[Any]]]:
        """Each chunk's arrays: ``fields`` plus ``ts``, ``report``, ``seq``, ``boot_no``."""
        stored = set(self._zf.namelist())
        for chunk in self.meta["chunks"]:
            names = (*fields, "ts", "report", "seq", "boot_no")
            yield {
                name: self._load(path)
                for name in names
                if (path := f"{chunk['prefix']}/{name}.npy") in stored or name != frames.JOB_FIELD
            }

    def steps(self) -> Iterator[Step]:
        run_id = self.meta["run_id"]
        n = len(self.node_names)
        for arrays in self.chunks():
            for k in range(len(arrays["ts"])):
                boots = arrays["boot_no"][k].tolist()
                yield Step(
                    ts=float(arrays["ts"][k]),
                    nodes=np.flatnonzero(arrays["report"][k]),
                    seq=arrays["seq"][k],
                    boot_ids=[physics.boot_id(run_id, i, boots[i]) for i in range(n)],
                    columns={name: arrays[name][k] for name in frames.DYNAMIC_FIELDS if name in arrays},
                )

    def frames(self, source: telemetry.Source = "sim") -> Iterator[tuple[float, list[tuple[int, bytes]]]]:
        """Per step: its time and the NodeFrames (node index, JSON bytes) sent in it."""
        encoder = frames.Encoder(
            self.node_names,
            self.meta["static"],
            source=source,
            agent_version=self.meta["agent_version"],
            job_prefix=self.meta["run_id"],
        )
        for step in self.steps():
            yield step.ts, encoder.encode(step.columns, step.nodes, step.seq, step.boot_ids, step.ts)

    def events(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self._zf.read("events.jsonl").splitlines() if line]

    def truth(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self._zf.read("truth.jsonl").splitlines() if line]


def record(
    sim: simulation.Simulation,
    path: str | pathlib.Path,
    *,
    duration_s: float,
    interval_s: float,
    extra_meta: dict[str, Any] | None = None,
) -> Writer:
    """Run ``sim`` for ``duration_s`` simulated seconds, one step per ``interval_s``, into ``path``."""
    writer = Writer(path, sim, interval_s=interval_s, extra_meta=extra_meta)
    try:
        writer.add_events(sim.take_events())
        for _ in range(max(1, round(duration_s / interval_s))):
            sim.step(interval_s)
            writer.add_events(sim.take_events())
            writer.add_truth(sim.take_truth())
            writer.add_step()
    finally:
        writer.close()
    return writer
