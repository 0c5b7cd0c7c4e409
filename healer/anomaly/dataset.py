"""Training and evaluation data: window features from simulator recordings (columnar, no per-frame
objects) or from the ``HEALER_TELEMETRY`` stream (frames decoded at the edge, folded by FleetWindow).

Both give a ``Windows``: base features per window end, node and GPU, the valid mask, the time of each
window end, and each GPU's model name (the model class for the peer baselines).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from healer import errors
from healer.anomaly import features, window
from healer.bus import subjects
from healer.schemas import codec

if TYPE_CHECKING:
    from healer.bus import nats as natsbus

F64 = npt.NDArray[np.float64]


@dataclasses.dataclass
class Windows:
    """Window features (windows, nodes, gpus, BASE_FEATURES) with their valid mask and end times."""

    ts: F64
    feats: F64
    valid: npt.NDArray[np.bool_]
    node_names: list[str]
    models: list[list[str | None]]
    source: str

    @property
    def span_s(self) -> tuple[float, float]:
        return (float(self.ts[0]), float(self.ts[-1])) if len(self.ts) else (0.0, 0.0)


def from_recording(
    path: str | pathlib.Path,
    *,
    window_s: float = 300.0,
    bucket_s: float = 30.0,
    progress: Callable[[int, int], None] | None = None,
) -> Windows:
    """Window features every ``bucket_s`` over a simulator recording (``healer sim record``)."""
    from healer.sim import recording  # the simulator is only needed to read its files

    with recording.Recording(path) as rec:
        static = rec.meta["static"]
        stat = {
            name: np.array([[g.get(name) or np.nan for g in row] for row in static], dtype=np.float64)
            for name in ("power_default_w", "sm_clock_max_mhz")
        }
        models: list[list[str | None]] = [[g.get("model") for g in row] for row in static]
        fields = [f for f in features.RAW if f not in stat and f != features.TIME_FIELD] + ["present"]
        ids, sums = [], []
        last = None
        chunks = rec.meta["chunks"]
        for k, cols in enumerate(rec.chunks(fields)):
            b, s, last = features.bucket_recording(cols, stat, last, bucket_s)
            ids.append(b)
            sums.append(s)
            if progress:
                progress(k + 1, len(chunks))
        names = list(rec.node_names)
    if not ids:
        raise errors.PermanentError(f"{path}: recording has no steps")
    all_ids = np.concatenate(ids)
    all_sums = np.concatenate(sums)
    width = round(window_s / bucket_s)
    if all_ids[-1] - all_ids[0] + 1 < width:
        raise errors.PermanentError(f"{path}: shorter than one {window_s:g} s window")
    ends, win = features.sliding_windows(all_ids, all_sums, width)
    feats, valid = features.window_features(win, window_s)
    return Windows((ends + 1) * bucket_s, feats, valid, names, models, str(path))


def from_frames(
    frames: list[bytes],
    *,
    gpus_per_node: int = 8,
    window_s: float = 300.0,
    bucket_s: float = 30.0,
    source: str = "frames",
) -> tuple[Windows, int]:
    """Window features every ``bucket_s`` from encoded NodeFrames in arrival order, the way the
    controller would see them; returns the windows and the number of undecodable frames skipped."""
    fw = window.FleetWindow(gpus_per_node=gpus_per_node, window_s=window_s, bucket_s=bucket_s)
    bad = 0
    rows: list[tuple[float, F64, npt.NDArray[np.bool_]]] = []
    next_end: float | None = None
    for data in frames:
        try:
            frame = codec.decode_frame(data)
        except errors.DecodeError:
            bad += 1
            continue
        end = (np.floor(frame.ts / bucket_s) + 1) * bucket_s
        if next_end is None:
            next_end = end + window_s - bucket_s
        while frame.ts >= next_end:
            f, v = fw.features(next_end - 1e-6)
            rows.append((next_end, f, v))
            next_end += bucket_s
        fw.observe(frame)
    if next_end is not None:
        f, v = fw.features(next_end - 1e-6)
        rows.append((next_end, f, v))
    n = len(fw)
    g = gpus_per_node
    nf = len(features.BASE_FEATURES)
    feats = np.full((len(rows), n, g, nf), np.nan)
    valid = np.zeros((len(rows), n, g), dtype=bool)
    for k, (_, f, v) in enumerate(rows):
        feats[k, : len(f)] = f
        valid[k, : len(v)] = v
    ts = np.array([r[0] for r in rows], dtype=np.float64)
    return Windows(ts, feats, valid, list(fw.node_names), fw.models, source), bad


async def stream_frames(
    url: str | Callable[[], Awaitable[natsbus.NatsBus]],
    subj: subjects.Subjects,
    *,
    limit: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> list[bytes]:
    """Every frame in the telemetry stream (or the first ``limit``), read with an ordered consumer.
    ``url`` is a NATS URL or a function that connects (the CLI's, with credentials and TLS)."""
    from healer.bus import nats as natsbus  # only this path needs a NATS connection

    if isinstance(url, str):
        bus = await natsbus.NatsBus.connect(url, name="healer-model-train")
    else:
        bus = await url()
    try:
        stream = subj.stream_telemetry
        try:
            replay = await bus.replay(stream, subj.all_telemetry)
        except errors.HealerError as e:
            raise errors.PermanentError(f"cannot read stream {stream}: {e}") from e
        try:
            total = min(replay.backlog, limit) if limit else replay.backlog
            out: list[bytes] = []
            while len(out) < total:
                msg = await replay.next(5.0)
                if msg is None:
                    raise errors.TemporaryError(
                        f"stream {stream}: nothing came for 5 s ({len(out)} of {total} read)"
                    )
                out.append(msg.data)
                if progress:
                    progress(len(out), total)
                if msg.pending == 0:
                    break
        finally:
            await replay.close()
        return out
    finally:
        await bus.close()
