"""``healer doctor``: is this node ready for healer? One line per check with what to do (docs/doctor.md).

Exit 0: every check ok (or a fact to know); 1: something healer needs is missing; 2: warnings only.
``--json`` prints the same report, schema ``healer.doctor.v1``. Settings are the agent's (``--config``,
the environment): the node name, ``agent.gpus_expected``, ``agent.sysfs_root``, ``agent.kmsg_path``,
``agent.job_map_dir``, ``agent.reboot_command``, and ``nats.*`` for the NATS checks.
"""

from __future__ import annotations

import argparse
import json
import socket
from typing import TYPE_CHECKING, Any

from healer import logs
from healer.cli import common, lazy

if TYPE_CHECKING:
    from healer.agent import doctor_host, doctor_run
else:
    doctor_host = lazy.module("healer.agent.doctor_host")
    doctor_run = lazy.module("healer.agent.doctor_run")


def register(sub: Any) -> None:
    p = sub.add_parser("doctor", help="check that this node is ready for the healer agent")
    p.add_argument("--node", help="node name as in `healer nats config` (default: agent.node, host name)")
    p.add_argument(
        "--gpus-expected", type=int, help="GPUs this node must have (default: agent.gpus_expected)"
    )
    p.add_argument(
        "--write-test", action="store_true", help="set each GPU's power limit 10 W lower and restore it"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON (schema healer.doctor.v1)")
    p.add_argument("--rules", help="rule pack directory (default: controller.rules_dir, rules)")
    p.add_argument("--no-nats", action="store_true", help="skip the NATS checks")
    p.add_argument("--nats-monitor", help="NATS monitoring URL (http://server:8222), for the clock offset")
    p.add_argument("--sysfs-root", help="where sysfs is (default: agent.sysfs_root, /sys)")
    p.add_argument(
        "--proc-root", help="the host's procfs, for Fabric Manager (default: agent.proc_root, /proc)"
    )
    p.add_argument("--dev-root", default="/dev", help="where the host's devices are (default: /dev)")
    common.add_nats_option(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    s = common.settings(
        args,
        agent={
            "node": args.node,
            "gpus_expected": args.gpus_expected,
            "sysfs_root": args.sysfs_root,
            "proc_root": args.proc_root,
        },
        controller={"rules_dir": args.rules},
    )
    logs.configure("error", s.log.format)  # stderr; every finding is in the report itself
    a = s.agent
    options = doctor_run.Options(
        node=a.node or socket.gethostname(),
        gpus_expected=a.gpus_expected,
        write_test=args.write_test,
        paths=doctor_host.HostPaths(
            kmsg=a.kmsg_path,
            sysfs_root=a.sysfs_root,
            proc_root=a.proc_root,
            fabric_manager_pid_file=a.fabric_manager_pid_file,
            dev_root=args.dev_root,
            job_map_dir=a.job_map_dir,
        ),
        rules_dir=s.controller.rules_dir,
        settings=None if args.no_nats else s,
        monitor_url=args.nats_monitor,
        reboot_command=a.reboot_command,
    )
    report = doctor_run.run(options)
    if args.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=False))
    else:
        print("\n".join(report.lines()))
    return report.exit_code
