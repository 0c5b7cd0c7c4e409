"""The inputs of a backtest (``backtest``): recorded NodeFrame JSON lines (plain, gzip, or ``-`` for standard
input) and ground-truth files (the shared generator's ``--truth`` JSON, or healer simulator truth entries).
"""

from __future__ import annotations

import gzip
import pathlib
import sys
from collections.abc import Iterator
from typing import IO, Any, cast

import orjson

from healer import errors


def open_lines(path: str | pathlib.Path) -> tuple[IO[bytes], IO[bytes] | None]:
    """A binary stream over a JSON-lines recording, and the file under it to close (None for standard
    input): ``-`` is standard input; gzip is recognised by its magic bytes, whatever the file is
    called. The file is opened once and only peeked at, so a pipe (``<(generator ...)``) works as well
    as a file."""
    under: Any = None if str(path) == "-" else open(path, "rb")  # noqa: SIM115 (closed by read_lines)
    raw: Any = sys.stdin.buffer if under is None else under
    peek = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
    return cast(IO[bytes], gzip.GzipFile(fileobj=raw) if peek == b"\x1f\x8b" else raw), under


def read_lines(path: str | pathlib.Path) -> Iterator[bytes]:
    """Each non-empty line of a recording (``open_lines``), without its newline."""
    fh, under = open_lines(path)
    try:
        for line in fh:
            line = line.strip()
            if line:
                yield line
    finally:
        if under is not None:
            fh.close()
            under.close()


def load_truth(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """Faults from a ground-truth file: the shared generator's ``--truth`` JSON (``faults`` with
    ``onset_ts``) or a list of healer simulator truth entries (``start``). Each comes back as
    ``{"kind", "node", "gpu", "start"}``; ``gpu`` is None for a node fault."""
    try:
        doc = orjson.loads(pathlib.Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise errors.PermanentError(f"{path}: cannot read the ground truth: {e}") from e
    rows = doc.get("faults", []) if isinstance(doc, dict) else doc
    out = []
    for f in rows:
        try:
            start = float(f["onset_ts"] if "onset_ts" in f else f["start"])
            gpu = f.get("gpu")
            out.append(
                {
                    "kind": str(f["kind"]),
                    "node": str(f["node"]),
                    "gpu": None if gpu is None else int(gpu),
                    "start": start,
                }
            )
        except (KeyError, TypeError, ValueError) as e:
            raise errors.PermanentError(f"{path}: a fault without kind, node or onset: {f!r}") from e
    return out
