"""``healer act``: run one actuator by hand, exactly as the controller would, and print the outcome.

For operators (``healer act slurm cordon gpu01 --incident manual-1 --dry-run`` shows the very commands
healer would run) and for trying a site's settings (node-name mapping, Slurm paths, kubeconfig) before
letting the controller act. Power limits go through the agents and the bus, so they are not here.
Exit status: 0 when the outcome is done / already-done / planned, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import typing
from typing import Any

from healer import actions, config, errors, logs
from healer.actuators import base
from healer.cli import common

SYSTEMS = typing.get_args(config.ActuatorName)
KINDS = actions.View(lambda: (*actions.SCHEDULER_VERBS, *actions.kinds_where(lambda k: k.published_only)))
"""What a scheduler actuator can be asked to do, and the kinds only recorded (notify), from the registry
when the command line is read."""


def register(sub: Any) -> None:
    parser = sub.add_parser("act", help="run one remediation action by hand (cordon, uncordon, migrate)")
    parser.add_argument("system", choices=SYSTEMS, help="which actuator")
    parser.add_argument("kind", choices=KINDS, help="which action")
    parser.add_argument(
        "node", help="node name as telemetry knows it (mapped by actuators.node_name_template)"
    )
    parser.add_argument("--incident", default="manual", help="incident id recorded on the node (%(default)s)")
    parser.add_argument("--summary", default="set by hand", help="text after the incident id in the reason")
    parser.add_argument(
        "--dry-run", action="store_true", help="read state and print the plan; change nothing"
    )
    parser.add_argument(
        "--any-incident", action="store_true", help="uncordon even if healer drained it for another incident"
    )
    common.add_config_option(parser)
    parser.set_defaults(func=_act)


def _actuator(system: config.ActuatorName, settings: config.ActuatorSettings) -> base.Actuator:
    from healer.actuators import factory

    return factory.build(system, settings)


def _act(args: argparse.Namespace) -> int:
    try:
        loaded = config.load(args.config)
        logs.configure(loaded.log.level, loaded.log.format)
        settings = loaded.actuators
        actuator = _actuator(args.system, settings)
    except errors.HealerError as e:
        print(f"healer act: {e}", file=sys.stderr)
        return 2
    request = base.ActionRequest(
        incident_id=args.incident,
        kind=args.kind,
        node=args.node,
        summary=args.summary,
        dry_run=args.dry_run,
        params={"any_incident": True} if args.any_incident else {},
    )
    outcome = asyncio.run(actuator.apply(request))
    close = getattr(actuator, "close", None)
    if callable(close):
        close()
    print(outcome.model_dump_json(indent=2))
    return 0 if outcome.ok else 1
