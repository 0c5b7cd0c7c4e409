"""``healer incidents verdict ID --confirmed | --false-alarm``: an operator's verdict, on the feed.

The verdict is published as an ``io.healer.incident.verdict.v1`` CloudEvent on
``<prefix>.incidents.verdict.<incident id>`` (``schemas.verdicts``), so it is stored in
``HEALER_INCIDENTS`` with the incidents; ``healer archive`` keeps it, and ``healer report`` computes
precision per rule from verdicts (docs/archive.md). A later verdict on the same incident replaces an
earlier one in the figures. The incident is not looked up: a verdict on an id the archive does not know
counts toward no rule.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
from typing import Any

from healer import errors, logs
from healer.bus import subjects
from healer.cli import common
from healer.feed import operator
from healer.schemas import verdicts


def register(isub: Any) -> None:
    """Adds ``verdict`` to ``healer incidents`` (``isub``: its subparsers)."""
    v = isub.add_parser(
        "verdict", help="say whether an incident was real or a false alarm", description=__doc__
    )
    common.add_nats_option(v)
    v.add_argument("incident", help="the incident id")
    which = v.add_mutually_exclusive_group(required=True)
    which.add_argument("--confirmed", action="store_true", help="a real fault: the rule was right")
    which.add_argument(
        "--false-alarm", action="store_true", help="nothing was wrong: the rule fired for nothing"
    )
    v.add_argument("--note", default="", help="why, for the archive")
    v.add_argument("--by", help="who gives the verdict (default: your user name)")
    v.set_defaults(func=_verdict)


def _verdict(args: argparse.Namespace) -> int:
    s = common.settings(args)
    logs.configure("error")
    try:
        operator.check_incident_id(args.incident)
    except ValueError as e:
        raise common.SettingsError(str(e)) from None
    verdict = verdicts.Verdict.CONFIRMED if args.confirmed else verdicts.Verdict.FALSE_ALARM
    data = verdicts.VerdictData(
        incident_id=args.incident, verdict=verdict, by=args.by or getpass.getuser(), note=args.note
    )

    async def main() -> verdicts.VerdictEvent:
        bus = await common.connect(s, "healer-cli")
        try:
            subj = subjects.Subjects(s.nats.prefix)
            return await operator.publish_verdict(bus, subj, s.controller.cluster, data)
        finally:
            await bus.close()

    try:
        event = asyncio.run(main())
    except errors.HealerError as e:
        print(f"healer incidents verdict: {e}", file=sys.stderr)
        return common.EXIT_FAILED
    print(f"{verdict} on {args.incident} published as {event.id}")
    return 0
