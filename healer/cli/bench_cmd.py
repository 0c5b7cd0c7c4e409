"""``healer bench controller``: measured throughput and latency (see healer/bench.py)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmarks")
    bsub = p.add_subparsers(dest="bench_command", metavar="WHAT")
    bsub.required = True
    c = bsub.add_parser(
        "controller", help="controller throughput vs a bare subscriber, fault-to-action latency"
    )
    c.add_argument(
        "--nodes", type=int, default=2000, help="distinct nodes in the flood (default %(default)s)"
    )
    c.add_argument("--seconds", type=float, default=8.0, help="length of each flood (default %(default)s)")
    c.add_argument(
        "--latency-nodes", type=int, default=1000, help="nodes at 1 Hz for latency (default %(default)s)"
    )
    c.add_argument("--faults", type=int, default=10, help="faults injected for latency (default %(default)s)")
    c.add_argument("--rules", default="rules", help="rule pack (default %(default)s)")
    c.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="interleaved throughput rounds, best of each (default %(default)s)",
    )
    c.add_argument(
        "--latency-shards",
        type=int,
        default=1,
        help="run the latency controller as shard 0 of this many (default %(default)s)",
    )
    c.add_argument(
        "--xid-events",
        type=int,
        default=20,
        help="fatal XID events for XID-to-action latency (default %(default)s)",
    )
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_controller)


def _controller(args: argparse.Namespace) -> int:
    from healer import bench

    return bench.main(
        args.nodes,
        args.seconds,
        args.latency_nodes,
        args.faults,
        args.rules,
        args.json,
        args.rounds,
        args.latency_shards,
        args.xid_events,
    )
