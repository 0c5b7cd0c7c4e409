"""The sizing table in docs/deployment.md is computed from the settings, rounded up, and current."""

from __future__ import annotations

import pathlib

import pytest

from healer import cli, config, sizing

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "deployment.md"


def test_the_deployment_guide_carries_the_computed_table() -> None:
    text = DOC.read_text()
    assert text == sizing.rewrite(text), "run: python -m healer.sizing docs/deployment.md"
    assert sizing.table() in text


@pytest.mark.parametrize("row", sizing.ROWS, ids=lambda r: f"{r.nodes}x{r.interval_s:g}s-{r.max_age_s:g}")
def test_every_row_rounds_up_never_below_the_reservation(row: sizing.Row) -> None:
    ns = row.settings()
    store = sizing.store_bytes(ns)
    assert ns.reserved_bytes() <= store < ns.reserved_bytes() + sizing.MIB
    shown = float(sizing.gib_up(ns.reserved_bytes()).split()[0].replace(",", ""))
    assert shown * sizing.GIB >= ns.reserved_bytes(), "the GiB figure is not below what is reserved"


def test_gib_up_rounds_up_where_the_typed_table_rounded_down() -> None:
    assert sizing.gib_up(int(2.537 * sizing.GIB)) == "2.54 GiB"
    assert sizing.gib_up(2 * sizing.GIB) == "2.00 GiB"


def test_provision_dry_run_prints_the_store_to_set(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["nats", "provision", "--fleet-nodes", "1000", "--frame-interval", "5", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0
    ns = config.NatsSettings(fleet_nodes=1000, frame_interval_s=5.0)
    assert f"max_file_store: {sizing.store_bytes(ns)}" in out
    assert "6.19 GiB" in out
