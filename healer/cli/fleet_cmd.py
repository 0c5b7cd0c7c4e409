"""``healer fleet show``: the admitted fleet and the failure domains the controller would believe (#27).

It builds the controller's own ``admission.Admission`` from the same settings (``controller.admission``,
``inventory_file``, ``topology_file``, ``domain_labels``), so what it prints is what the controller reads:
the inventory file's nodes and labels, or (``admission: scheduler``) the scheduler's labels of the
``NODE`` names given, plus Slurm's switch tree. ``--by KEY`` prints one domain key's groups only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any

import structlog

from healer import errors, logs
from healer.cli import common, lazy

if TYPE_CHECKING:
    from healer.actuators import factory
    from healer.controller.inventory import admission
    from healer.controller.observability import metrics
else:
    factory = lazy.module("healer.actuators.factory")
    admission = lazy.module("healer.controller.inventory.admission")
    metrics = lazy.module("healer.controller.observability.metrics")


def register(sub: Any) -> None:
    p = sub.add_parser("fleet", help="the admitted fleet and its failure domains")
    fsub = p.add_subparsers(dest="fleet_command", metavar="ACTION")
    fsub.required = True
    show = fsub.add_parser(
        "show",
        help="print the topology the controller believes",
        description="The admitted nodes and their failure domains (rack, switch, ...), from the "
        "controller's settings: the inventory file, the scheduler's labels, Slurm's topology.conf.",
    )
    common.add_config_option(show)
    show.add_argument(
        "nodes", nargs="*", metavar="NODE", help="with admission: scheduler, the names to ask about"
    )
    show.add_argument(
        "--actuator", choices=["log", "slurm", "kubernetes"], help="default: controller.actuator"
    )
    show.add_argument("--by", metavar="KEY", help="only this domain key's groups")
    show.set_defaults(func=_show)


def _show(args: argparse.Namespace) -> int:
    s = common.settings(args, controller={"actuator": args.actuator})
    logs.configure("error")

    async def main() -> dict[str, Any]:
        scheduler = factory.scheduler(s)
        adm = admission.Admission(
            s.controller,
            metrics.ControllerMetrics(),
            scheduler=scheduler,
            log=structlog.get_logger("healer.fleet"),
        )
        if s.controller.admission != "file" and args.nodes:
            for node in args.nodes:
                adm.admits(node)  # first-seen admits; scheduler queues the name to ask about
            await adm.refresh()
        return adm.topology().dump()

    try:
        doc = asyncio.run(main())
    except errors.HealerError as e:
        print(f"healer fleet: {e}", file=sys.stderr)
        return 1
    if args.by:
        doc = {"key": args.by, "domains": doc["domains"].get(args.by, {})}
    print(json.dumps(doc, indent=2))
    return 0
