"""How large a NATS server's JetStream store must be for healer: computed from the settings, never typed.

JetStream reserves every stream's byte limit in each server's ``max_file_store`` holding a replica, and
refuses a stream that does not fit. healer's streams and buckets reserve ``NatsSettings.reserved_bytes``
together (telemetry sized from the fleet), so that sum, rounded up, is the smallest store to give each
server. Provisioning looks a stream up before it creates it (healer/bus/provision.py), so a restart, a
standby or a second provision needs no room beyond what the streams hold; raising a limit later (a fleet
grew) needs the difference free in the store (checked against nats-server: an update reserves only
what it adds). docs/deployment.md's sizing table is this module's output (``python -m healer.sizing
docs/deployment.md`` rewrites it; a drift test keeps it current).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import sys

from healer import config

GIB = 2**30
MIB = 2**20


@dataclasses.dataclass(frozen=True)
class Row:
    """One fleet shape of the documented table."""

    nodes: int
    interval_s: float
    max_age_s: float = 3600.0

    def settings(self) -> config.NatsSettings:
        return config.NatsSettings(
            fleet_nodes=self.nodes, frame_interval_s=self.interval_s, telemetry_max_age_s=self.max_age_s
        )


ROWS = (
    Row(64, 1.0),
    Row(1_000, 5.0),
    Row(1_000, 1.0),
    Row(10_000, 5.0),
    Row(10_000, 1.0, max_age_s=600.0),
    Row(10_000, 1.0),
)
"""The fleet shapes docs/deployment.md lists (8-GPU nodes, ``frame_bytes`` 8000)."""


def store_bytes(ns: config.NatsSettings) -> int:
    """The smallest ``max_file_store`` for these settings: the reservation rounded up to a whole MiB."""
    return math.ceil(ns.reserved_bytes() / MIB) * MIB


def gib_up(n: int) -> str:
    """``n`` bytes in GiB, rounded up to two decimals (a store sized from a rounded-down figure fails)."""
    return f"{math.ceil(n / GIB * 100) / 100:,.2f} GiB"


def _interval(row: Row) -> str:
    kept = (
        ""
        if row.max_age_s == 3600.0
        else f", {row.max_age_s / 60:g} min kept (`telemetry_max_age_s: {row.max_age_s:g}`)"
    )
    return f"{row.interval_s:g} s{kept}"


BEGIN = "<!-- sizing table: python -m healer.sizing docs/deployment.md -->"
END = "<!-- end of sizing table -->"


def table() -> str:
    """The markdown table between ``BEGIN`` and ``END`` in docs/deployment.md."""
    lines = [
        "| nodes | interval | telemetry limit | all of healer's streams (`max_file_store` at least) "
        "| bytes |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in ROWS:
        ns = row.settings()
        lines.append(
            f"| {row.nodes:,} | {_interval(row)} | {gib_up(ns.telemetry_bytes())} | "
            f"{gib_up(ns.reserved_bytes())} | {store_bytes(ns)} |"
        )
    return "\n".join(lines)


def rewrite(doc: str) -> str:
    """``doc`` with the text between the markers replaced by the current table."""
    head, sep, rest = doc.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise ValueError(f"the sizing markers are missing: {BEGIN!r} ... {END!r}")
    return f"{head}{BEGIN}\n{table()}\n{END}{tail}"


def main(argv: list[str]) -> int:
    path = pathlib.Path(argv[0])
    path.write_text(rewrite(path.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
