"""``healer archive --export-parquet DIR``: every table of the archive written and read back, row for row
and type for type, with the archive's schema version in each file; a clear refusal without pyarrow."""

from __future__ import annotations

import pathlib
import sqlite3
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from healer import cli, errors
from healer.archive import parquet, store
from tests.archive import test_report


@pytest.fixture
def archive(tmp_path: pathlib.Path) -> pathlib.Path:
    return test_report.build_archive(tmp_path / "archive.db")


def test_each_table_is_written_and_reads_back_as_it_is_in_the_archive(
    archive: pathlib.Path, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "parquet"
    assert cli.main(["archive", "--db", str(archive), "--export-parquet", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{t}.parquet" for t in parquet.TABLES)
    types = {"TEXT": pa.string(), "INTEGER": pa.int64(), "REAL": pa.float64()}
    with sqlite3.connect(archive) as conn:
        for table in parquet.TABLES:
            expected = conn.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()
            columns = conn.execute(f"PRAGMA table_info({table})").fetchall()
            read = pq.read_table(out / f"{table}.parquet")
            assert read.schema.names == [c[1] for c in columns]
            assert [f.type for f in read.schema] == [types[c[2]] for c in columns]
            assert read.schema.metadata[parquet.METADATA_KEY] == str(store.SCHEMA_VERSION).encode()
            rows = [tuple(r.values()) for r in read.to_pylist()]
            assert rows == expected, table
            assert expected, f"the hand-built archive has rows in {table}"
            assert f"{out / table}.parquet: {len(expected)} rows" in printed
    assert not list(out.glob(".*")), "no temporary file is left behind"


def test_an_empty_archive_exports_empty_tables_with_their_columns(tmp_path: pathlib.Path) -> None:
    store.Archive(tmp_path / "empty.db").close()
    with store.Archive(tmp_path / "empty.db", readonly=True) as db:
        written = parquet.export(db, tmp_path / "out")
    assert [(w.table, w.rows) for w in written] == [(t, 0) for t in parquet.TABLES]
    assert pq.read_table(tmp_path / "out" / "verdicts.parquet").schema.names == [
        "id", "incident_id", "verdict", "by", "note", "time",
    ]  # fmt: skip


def test_without_pyarrow_the_export_says_what_to_install(
    archive: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # an import of it raises ImportError
    with store.Archive(archive, readonly=True) as db, pytest.raises(errors.PermanentError) as e:
        parquet.export(db, tmp_path / "out")
    assert "pip install 'healer[archive]'" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_the_command_refuses_a_missing_archive(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "out"
    assert cli.main(["archive", "--db", str(tmp_path / "none.db"), "--export-parquet", str(out)]) == 2
    assert not out.exists()
