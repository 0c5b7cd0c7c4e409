"""Truth records become per-sample labels the same way for every consumer."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from healer import errors
from healer.sim import faults, recording, scenarios, truth


def test_labels_mark_exactly_the_faulty_gpus_while_the_fault_lasts(tmp_path: pathlib.Path) -> None:
    sim = scenarios.build(scenarios.load("mixed"), nodes=16, gpus=8, seed=4)
    path = tmp_path / "r.npz"
    recording.record(sim, path, duration_s=1800.0, interval_s=10.0)
    with recording.Recording(path) as rec:
        ts = np.concatenate([c["ts"] for c in rec.chunks(())])
        records = rec.truth()
        lab = truth.labels(records, ts, rec.node_names, 8)
    assert lab.shape == (180, 16, 8)
    expected = set()
    for r in records:
        n = int(r["node"].rsplit("-", 1)[1])
        gpus = range(8) if r["gpu"] is None else [r["gpu"]]
        expected |= {(n, g) for g in gpus}
        code = truth.KINDS.index(r["kind"]) + 1
        active = (ts >= r["visible_at"]) & (ts < (r["end"] or np.inf))
        for g in gpus:
            assert (lab[active, n, g] == code).all(), r["kind"]
            assert (lab[ts < r["visible_at"], n, g] == 0).all(), r["kind"]
    assert {(int(n), int(g)) for n, g in zip(*np.nonzero(lab.any(axis=0)), strict=True)} == expected
    truth.write(tmp_path / "t.jsonl", records)
    assert truth.read(tmp_path / "t.jsonl") == records
    assert set(truth.KINDS) == set(faults.KINDS)


def test_a_broken_truth_file_is_reported_with_its_line(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"node": "a", "kind": "ecc_dbe", "start": 1, "visible_at": 1}\n{oops\n')
    with pytest.raises(errors.PermanentError, match=r"t.jsonl:2: not JSON"):
        truth.read(bad)
