"""``healer model status``: each pool's anomaly calibration (shadow or live, node-days, thresholds,
measured rate), from the controller's KV or a saved scorer state."""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

from healer import errors, logs
from healer.cli import common


def add_parser(msub: Any) -> None:
    st = msub.add_parser(
        "status",
        help="each pool's calibration: shadow or live, node-days, thresholds, measured rate "
        "(from the controller's KV, or a saved state file)",
    )
    st.add_argument("--state", type=pathlib.Path, help="a saved scorer state (JSON) instead of KV")
    st.add_argument("--nats", metavar="URL", help="NATS URL (default: nats.url)")
    st.add_argument("--prefix", help="subject prefix (default: nats.prefix, healer)")
    common.add_config_option(st)
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_status)


def _status(args: argparse.Namespace) -> int:
    """Each pool's calibration (``cfar.Calibration.status``), from KV ``anomaly.state`` or a file."""
    from healer.anomaly import cfar

    s = common.settings(args)
    doc: dict[str, Any] | None
    if args.state is not None:
        try:
            doc = json.loads(args.state.read_text()).get("cfar")
        except (OSError, ValueError) as e:
            print(f"error: {args.state}: {e}", file=sys.stderr)
            return 1
    else:
        import asyncio

        from healer.anomaly import scorer_state
        from healer.cli import controller_cmd

        logs.configure("error")

        async def read() -> dict[str, Any] | None:
            bus, store = await controller_cmd._state_store(s)
            try:
                got = await store.get(scorer_state.DEFAULT_KEY)
                return None if got is None else got.value.get("cfar")
            finally:
                await bus.close()

        try:
            doc = asyncio.run(read())
        except errors.HealerError as e:
            print(f"healer model status: {e}", file=sys.stderr)
            return 1
    a = s.anomaly
    cal = cfar.Calibration(
        cfar.CfarSettings(
            budget_per_1000_node_days=a.false_alarm_budget, min_node_days=a.calibration_node_days
        )
    )
    if not isinstance(doc, dict) or not cal.import_(doc):
        none = "no pool calibration saved yet (a controller with a model saves it every anomaly_save_s)"
        print("[]" if args.json else none)
        return 0
    rows = cal.status()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{'pool':<32} {'state':<6} {'node-days':>9} {'shadow':>6} {'live':>5} {'per 1,000':>9}  thresholds"
    )
    for r in rows:
        rate = "-" if r["live_per_1000_node_days"] is None else f"{r['live_per_1000_node_days']:.1f}"
        thr = ", ".join(f"{k} {v:g}" for k, v in r["thresholds"].items())
        print(
            f"{r['pool']:<32} {r['state']:<6} {r['node_days']:>9.2f} {r['shadow_incidents']:>6} "
            f"{r['live_incidents']:>5} {rate:>9}  {thr}"
        )
    return 0
