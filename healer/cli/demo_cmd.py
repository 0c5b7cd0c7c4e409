"""``healer demo``: the embedded nats-server, a simulated fleet and what healer does with it."""

from __future__ import annotations

import argparse
from typing import Any

from healer import demo, logs


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run everything locally on a simulated fleet", description=demo.__doc__)
    p.add_argument("--duration", type=float, default=40.0, help="seconds (default %(default)s)")
    p.add_argument("--nodes", type=int, default=8, help="simulated nodes, 8 GPUs each (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print only the summary, as JSON")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    logs.configure("error")
    return demo.main(args.duration, args.nodes, args.json)
