"""``healer report``: the fleet's reliability from the incident archive (docs/archive.md).

Reads the archive ``healer archive`` writes (never writes it): incidents per rule and kind, time to
containment and to repair, GPU-hours lost by cause and per day, repeat offenders, breaker trips,
precision from operators' verdicts, and one fleet health score. Text by default; ``--json`` prints the
report (schema ``healer.report.v1``), ``--html FILE`` writes it as one self-contained page.
"""

from __future__ import annotations

import argparse
import pathlib
import sqlite3
import time
from typing import TYPE_CHECKING, Any

import orjson

from healer import durations, errors
from healer.cli import common, lazy

if TYPE_CHECKING:  # the real modules, for mypy; at run time they load on first use (cli/lazy.py)
    from healer.archive import figures, page, store
else:
    figures = lazy.module("healer.archive.figures")
    page = lazy.module("healer.archive.page")
    store = lazy.module("healer.archive.store")


def _label_gpus(text: str) -> tuple[str, str, int]:
    """``KEY=VALUE:GPUS`` (``pool=a100:512``): a pool's or domain's size, for its availability."""
    key, sep, rest = text.partition("=")
    value, sep2, gpus = rest.rpartition(":")
    if not (sep and sep2 and key and value and gpus.isdigit() and int(gpus) > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE:GPUS, e.g. pool=a100:512")
    return key, value, int(gpus)


def _duration(text: str) -> float:
    try:
        return durations.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def register(sub: Any) -> None:
    r = sub.add_parser(
        "report", help="the fleet's reliability from the incident archive", description=__doc__
    )
    r.add_argument("--db", type=pathlib.Path, required=True, help="the archive (healer archive --db)")
    r.add_argument(
        "--since", type=_duration, default=7 * 86400.0, help="the window, ending now (default: 7d)"
    )
    r.add_argument("--json", action="store_true", help="print the report as JSON (healer.report.v1)")
    r.add_argument("--html", type=pathlib.Path, help="write the report as one self-contained HTML file")
    r.add_argument("--fleet-gpus", type=int, help="GPUs in the fleet (default: nodes seen x --node-gpus)")
    r.add_argument(
        "--node-gpus", type=int, default=8, help="a node's GPUs when its evidence does not say (8)"
    )
    r.add_argument(
        "--repeat-threshold", type=int, default=3, help="incidents that make a repeat offender (3)"
    )
    r.add_argument(
        "--repeat-window", type=_duration, default=30 * 86400.0, help="window of repeat offenders (30d)"
    )
    r.add_argument(
        "--label-gpus", type=_label_gpus, action="append", default=[], metavar="KEY=VALUE:GPUS",
        help="a pool's or domain's GPUs (pool=a100:512), for its availability; repeat per pool",
    )  # fmt: skip
    r.add_argument("--now", type=float, help=argparse.SUPPRESS)  # the window's end, for tests
    r.set_defaults(func=_report)


def _sizes(given: list[tuple[str, str, int]]) -> dict[str, dict[str, int]]:
    sizes: dict[str, dict[str, int]] = {}
    for key, value, gpus in given:
        sizes.setdefault(key, {})[value] = gpus
    return sizes


def _report(args: argparse.Namespace) -> int:
    if not args.db.is_file():
        raise common.SettingsError(f"no archive at {args.db} (healer archive --db writes it)")
    opts = figures.Options(
        end=args.now if args.now is not None else time.time(), since_s=args.since,
        fleet_gpus=args.fleet_gpus, node_gpus=args.node_gpus, repeat_threshold=args.repeat_threshold,
        repeat_window_s=args.repeat_window, label_gpus=_sizes(args.label_gpus),
    )  # fmt: skip
    try:
        with store.Archive(args.db, readonly=True) as db:
            report = figures.build(db, opts)
    except sqlite3.Error as e:
        raise errors.PermanentError(f"cannot read the archive {args.db}: {e}") from e
    except errors.PermanentError as e:
        raise common.SettingsError(str(e)) from e
    if args.html is not None:
        args.html.write_text(page.render(report))
    if args.json:
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        print(summary(report))
    return 0


def summary(report: dict[str, Any]) -> str:
    """A few lines for a terminal."""
    fleet, totals = report["fleet"], report["totals"]
    score = "-" if fleet["health_score"] is None else f"{fleet['health_score']:.1f}"
    lines = [
        f"incidents {totals['incidents']}, GPU-hours lost {totals['gpu_hours_lost']:.2f}, "
        f"fleet health score {score}",
    ]
    for r in report["by_rule"]:
        p50 = r["to_resolution"]["p50_s"]
        repair = "-" if p50 is None else durations.to_text(round(p50))
        lines.append(f"  {r['rule_id']} ({r['kind']}): {r['incidents']} incidents, repair p50 {repair}")
    for o in report["repeat_offenders"]:
        where = o["node"] if o["gpu_index"] is None else f"{o['node']}/gpu{o['gpu_index']}"
        lines.append(f"  repeat offender {where}: {o['incidents']} incidents ({', '.join(o['rules'])})")
    return "\n".join(lines)
