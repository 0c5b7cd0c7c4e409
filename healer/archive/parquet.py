"""The archive as Parquet files, for data teams: ``healer archive --db PATH --export-parquet DIR``.

One file per table of the archive (``events``, ``incidents``, ``actions``, ``verdicts``), each with the
table's columns and SQLite types as Parquet types (TEXT as string, INTEGER as int64, REAL as float64;
times stay unix seconds, JSON columns stay JSON text, as in the archive: docs/archive.md's schema). Each
file carries the archive's schema version in its key-value metadata (``healer.archive.schema_version``).

It reads the archive read-only, so it runs beside a live ``healer archive`` (the write-ahead log lets a
reader see the last committed batch). Rows are streamed in batches; each file is written under a
temporary name and renamed, so a reader of DIR never sees half a file.

pyarrow is an optional extra (``pip install 'healer[archive]'``); without it the export says so.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pathlib
from typing import Any, Final

from healer import errors
from healer.archive import store

TABLES: Final = ("events", "incidents", "actions", "verdicts")
BATCH_ROWS: Final = 16384
METADATA_KEY: Final = b"healer.archive.schema_version"


@dataclasses.dataclass(frozen=True)
class Exported:
    table: str
    path: pathlib.Path
    rows: int


def _pyarrow() -> tuple[Any, Any]:
    try:
        return importlib.import_module("pyarrow"), importlib.import_module("pyarrow.parquet")
    except ImportError as e:
        raise errors.PermanentError("the Parquet export needs pyarrow: pip install 'healer[archive]'") from e


def _arrow_type(pa: Any, declared: str) -> Any:
    """The Parquet (Arrow) type of a column of the archive's DDL."""
    types = {"TEXT": pa.string(), "INTEGER": pa.int64(), "REAL": pa.float64()}
    try:
        return types[declared.upper()]
    except KeyError:
        raise errors.PermanentError(f"the archive has a column of type {declared!r}") from None


def _schema(pa: Any, archive: store.Archive, table: str) -> Any:
    columns = list(archive.rows(f"PRAGMA table_info({table})"))
    return pa.schema(
        [pa.field(c["name"], _arrow_type(pa, c["type"]), nullable=not c["notnull"]) for c in columns],
        metadata={METADATA_KEY: str(store.SCHEMA_VERSION).encode()},
    )


def export_table(archive: store.Archive, table: str, out: pathlib.Path) -> Exported:
    """Write one table to ``out/<table>.parquet``; its rows in the table's key order."""
    if table not in TABLES:
        raise ValueError(table)
    pa, pq = _pyarrow()
    schema = _schema(pa, archive, table)
    path = out / f"{table}.parquet"
    tmp = out / f".{table}.parquet.tmp"
    names = schema.names
    rows = 0
    cur = archive.db.execute(f"SELECT {', '.join(names)} FROM {table} ORDER BY rowid")
    try:
        with pq.ParquetWriter(str(tmp), schema, compression="zstd") as writer:
            while batch := cur.fetchmany(BATCH_ROWS):
                columns = zip(*batch, strict=True)
                arrays = [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)]
                writer.write_table(pa.Table.from_arrays(arrays, schema=schema))
                rows += len(batch)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return Exported(table, path, rows)


def export(archive: store.Archive, out: pathlib.Path) -> list[Exported]:
    """Every table of the archive into ``out`` (made if absent)."""
    _pyarrow()  # fail before making anything
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise errors.PermanentError(f"cannot make {out}: {e}") from e
    return [export_table(archive, table, out) for table in TABLES]
