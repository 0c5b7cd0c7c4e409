"""Ground truth: reading and writing truth records, and turning them into per-sample labels.

A truth record (one JSON line) says which fault started where and when: ``id``, ``node``, ``gpu``
(``null`` for node-scope kinds), ``kind`` (a stable name from ``faults.KINDS``), ``start``,
``visible_at``, ``end`` (``null``: until the run ended) and ``params``. Scoring a detector, or training
a model, needs the same records as labels on samples; ``labels`` does that one way for everybody: a
GPU is labelled from ``visible_at`` (or ``start``) until ``end``, and a node-scope fault labels every
GPU of its node.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import orjson

from healer import errors
from healer.sim import faults

KINDS: tuple[str, ...] = tuple(faults.KINDS)
"""Every label a truth record can carry, in a fixed order (index + 1 is the code ``labels`` uses)."""


def write(path: str | pathlib.Path, records: Iterable[dict[str, Any]]) -> None:
    pathlib.Path(path).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))


def read(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """Truth records from a JSON-lines file; a malformed line is an error naming the line."""
    out = []
    try:
        lines = pathlib.Path(path).read_bytes().splitlines()
    except OSError as e:
        raise errors.PermanentError(f"cannot read truth file {path}: {e}") from e
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise errors.PermanentError(f"{path}:{number}: not JSON: {e}") from e
        if not isinstance(rec, dict) or not {"node", "kind", "start", "visible_at"} <= rec.keys():
            raise errors.PermanentError(f"{path}:{number}: not a truth record")
        out.append(rec)
    return out


def labels(
    records: Iterable[dict[str, Any]],
    ts: npt.NDArray[np.float64],
    node_names: Sequence[str],
    gpus: int,
    *,
    since: Literal["visible_at", "start"] = "visible_at",
) -> npt.NDArray[np.int16]:
    """Per sample (steps, nodes, gpus): 0 where healthy, else 1 + the index in ``KINDS`` of the fault
    active there (the latest-starting one where several overlap)."""
    index = {name: i for i, name in enumerate(node_names)}
    out = np.zeros((len(ts), len(node_names), gpus), dtype=np.int16)
    for rec in sorted(records, key=lambda r: r["start"]):
        node = index.get(rec["node"])
        if node is None:
            continue
        mask = ts >= rec[since]
        if rec.get("end") is not None:
            mask &= ts < rec["end"]
        gpu = slice(None) if rec.get("gpu") is None else rec["gpu"]
        out[mask, node, gpu] = KINDS.index(rec["kind"]) + 1
    return out
