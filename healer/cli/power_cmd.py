"""``healer power shed|status``: demand response and the power budgets as the leader sees them (#30).

``shed --domain rack=r7 --to 40 --for 30m`` asks the leader (``healer.power.shed``, request/reply,
``schemas/budgets.py``) to hold the domain at 40 kW for 30 minutes, then return to its budget;
``--cancel`` ends a running shed. ``status`` prints every budget, its live draw, its state and any shed
(``healer.power.status``). No leader answering within ``--timeout`` is exit 1, with why.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
import time
from typing import Any

from healer import durations, errors, logs
from healer.bus import subjects
from healer.cli import common
from healer.schemas import budgets, codec


def register(sub: Any) -> None:
    p = sub.add_parser("power", help="power budgets: demand response and status")
    psub = p.add_subparsers(dest="power_command", metavar="ACTION")
    psub.required = True
    shed = psub.add_parser(
        "shed",
        help="hold a domain at a lower power for a time (demand response)",
        description="Ask the controller's leader to hold a domain with a power budget at --to kW (the "
        "domain's power, as its breaker_kw or contract_kw; its GPUs get that x gpu_share) for --for, "
        "then return to its budget, stepwise.",
    )
    shed.add_argument("--domain", required=True, help="the budget's domain, key=value (rack=r7)")
    what = shed.add_mutually_exclusive_group(required=True)
    what.add_argument("--to", type=float, metavar="KW", help="the power to hold, in kW")
    what.add_argument("--cancel", action="store_true", help="end a running shed now")
    shed.add_argument("--for", dest="for_", default="30m", metavar="DURATION", help="how long (default 30m)")
    shed.add_argument("--reason", default="", help="why (in the controller's log)")
    status = psub.add_parser("status", help="every power budget: live draw, state, shed")
    status.add_argument("--json", action="store_true", help="print the leader's PowerStatus document")
    for a, name in ((shed, "shed"), (status, "status")):
        common.add_nats_option(a)
        a.add_argument(
            "--timeout", type=float, default=5.0, help="seconds to wait for the leader (default 5)"
        )
        a.set_defaults(func=_power, action=name)


def _request(args: argparse.Namespace) -> bytes:
    try:
        for_s = durations.parse(args.for_)
    except durations.DurationError as e:
        raise common.SettingsError(f"--for: {e}") from e
    try:
        req = budgets.ShedRequest(
            domain=args.domain, to_kw=args.to, for_s=for_s, cancel=args.cancel, by=getpass.getuser(),
            reason=args.reason,
        )  # fmt: skip
    except ValueError as e:
        raise common.SettingsError(str(e).splitlines()[-1] if str(e) else repr(e)) from e
    return codec.encode(req)


def _power(args: argparse.Namespace) -> int:
    s = common.settings(args)
    logs.configure("error")
    subj = subjects.Subjects(s.nats.prefix)
    body = _request(args) if args.action == "shed" else b"{}"
    subject = subj.power_shed if args.action == "shed" else subj.power_status

    async def main() -> bytes:
        bus = await common.connect(s, "healer-cli")
        try:
            reply = await bus.request(subject, body, timeout=args.timeout)
        finally:
            await bus.close()
        return reply.data

    try:
        data = asyncio.run(main())
    except errors.TemporaryError as e:
        print(f"healer power: no controller leader answered on {subject}: {e}", file=sys.stderr)
        return common.EXIT_FAILED
    except errors.HealerError as e:
        print(f"healer power: {e}", file=sys.stderr)
        return common.EXIT_FAILED
    try:
        if args.action == "shed":
            result = codec.decode_shed_result(data)
        else:
            doc = codec.decode_power_status(data)
    except errors.DecodeError as e:
        print(f"healer power: the reply does not decode: {e}", file=sys.stderr)
        return common.EXIT_FAILED
    if args.action == "shed":
        print(result.detail)
        if result.status is not None:
            print("\n".join(status_lines([result.status])))
        return common.EXIT_OK if result.ok else common.EXIT_FAILED
    if args.json:
        print(json.dumps(doc.model_dump(mode="json", by_alias=True), indent=2))
    else:
        print(f"leader {doc.holder}")
        print("\n".join(status_lines(doc.budgets)) if doc.budgets else "no power budgets configured")
    return common.EXIT_OK


def status_lines(rows: list[budgets.DomainStatus], now: float | None = None) -> list[str]:
    """One line per budget, and one for a running shed, for people."""
    now = time.time() if now is None else now
    out = []
    for r in rows:
        line = (
            f"{r.domain}  {r.phase:<6}  draw {r.draw_w / 1000:.1f} kW"
            f" / budget {r.budget_in_force_w / 1000:.1f} kW"
            f"  ({r.gpus} GPUs on {r.members} nodes, {r.capped_gpus} capped, {r.policy}; {r.source})"
        )
        if r.incident_id:
            line += f"  incident {r.incident_id}"
        out.append(line)
        if r.shed_to_w is not None and r.shed_until is not None and r.shed_until > now:
            left = durations.to_text(max(0.0, round(r.shed_until - now)))
            out.append(f"  shed to {r.shed_to_w / 1000:.1f} kW for the GPUs, {left} left")
    return out
