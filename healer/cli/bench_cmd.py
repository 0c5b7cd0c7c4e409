"""``healer bench controller``: measured throughput and latency (see healer/evals/controller_bench.py);
``healer bench stragglers``: the fail-slow scorer's figures (healer/evals/straggler_eval.py); ``healer bench
power``: the power-budget targets through the wired controller (healer/evals/power_bench.py); ``healer bench
burst``: N fatal XIDs at once in a 10,000-node fleet (healer/evals/burst_bench.py). The harnesses are
imported only when their command runs."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmarks")
    bsub = p.add_subparsers(dest="bench_command", metavar="WHAT")
    bsub.required = True
    _register_controller(bsub)
    _register_stragglers(bsub)
    _register_power(bsub)
    _register_burst(bsub)


def _register_controller(bsub: Any) -> None:
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
    c.add_argument(
        "--spread",
        action="store_true",
        help="the paced fleet sends each second's frames evenly over it, as agents on their own clocks do"
        " (default: in one burst, every node in step)",
    )
    c.add_argument(
        "--frame-arrivals-s",
        type=float,
        default=None,
        help="every controller's controller.frame_arrivals_s (default: its default, 0.1; 0: frames"
        " evaluated at ticks only)",
    )
    c.add_argument(
        "--agent-xid",
        type=int,
        default=0,
        metavar="N",
        help="also time N fatal XIDs from real agent processes' NVML event to the cordon, 10,000-node"
        " fleet, stage by stage (default %(default)s: not measured)",
    )
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_controller)


def _register_stragglers(bsub: Any) -> None:
    st = bsub.add_parser(
        "stragglers",
        help="fail-slow scorer on the shared independent fleet: false stragglers, detection, CPU share",
    )
    fleet = st.add_mutually_exclusive_group(required=True)
    fleet.add_argument("--generator", help="path of the independent fleet's gen.py")
    fleet.add_argument(
        "--simulator",
        action="store_true",
        help="healer's own simulator instead: jobs of 1-64 nodes, ports, step times; clock-limited"
        " GPUs, degraded NVLinks, congested ports, job-level stalls (a hypothesis)",
    )
    st.add_argument("--nodes", type=int, default=50, help="nodes per run (default %(default)s)")
    st.add_argument("--hours", type=float, default=6.0, help="simulated hours per run (default %(default)s)")
    st.add_argument(
        "--seeds",
        default="1000,1001",
        help="comma-separated seeds; < 1000 only for tuning (default %(default)s)",
    )
    st.add_argument("--faults", type=int, default=0, help="fail-slow faults injected per run (default none)")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_stragglers)


def _register_power(bsub: Any) -> None:
    pw = bsub.add_parser(
        "power",
        help="power-budget targets through the wired controller on a simulated rack (time-scaled)",
    )
    pw.add_argument("--nodes", type=int, default=8, help="nodes of 8 GPUs in the rack (default %(default)s)")
    pw.add_argument(
        "--speed", type=float, default=20.0, help="simulated seconds per wall second (default %(default)s)"
    )
    pw.add_argument(
        "--steady", type=float, default=1200.0, help="simulated seconds at full load (default %(default)s)"
    )
    pw.add_argument("--seed", type=int, default=1)
    pw.add_argument(
        "--policy",
        choices=("proportional", "priority"),
        default="proportional",
        help="the budget's policy; priority: the jobs of the rack's odd nodes run in QOS low, the even "
        "ones' in high, as the simulator's scheduler lists them (default %(default)s)",
    )
    pw.add_argument("--json", action="store_true")
    pw.set_defaults(func=_power)


def _register_burst(bsub: Any) -> None:
    b = bsub.add_parser(
        "burst",
        help="N fatal XIDs at once in a fleet: all contained and all ladders started, p50/p99, CPU"
        " (limits set to allow the burst; the recording scheduler; benchmarks/burst.py adds Slurm and"
        " Kubernetes)",
    )
    b.add_argument("--bursts", default="100,200,400,1000", help="burst sizes (default %(default)s)")
    b.add_argument("--fleet", type=int, default=10_000, help="nodes in the fleet (default %(default)s)")
    b.add_argument("--rules", default="rules", help="rule pack (default %(default)s)")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=_burst)


def _burst(args: argparse.Namespace) -> int:
    from healer.evals import burst_bench

    bursts = [int(x) for x in args.bursts.split(",") if x.strip()]
    return burst_bench.main(bursts, args.rules, args.json, args.fleet)


def _controller(args: argparse.Namespace) -> int:
    from healer.evals import controller_bench

    return controller_bench.main(
        args.nodes,
        args.seconds,
        args.latency_nodes,
        args.faults,
        args.rules,
        args.json,
        args.rounds,
        args.latency_shards,
        args.xid_events,
        args.spread,
        args.frame_arrivals_s,
        args.agent_xid,
    )


def _stragglers(args: argparse.Namespace) -> int:
    from healer.evals import straggler_eval

    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    return straggler_eval.main(
        None if args.simulator else args.generator, args.nodes, args.hours, seeds, args.faults, args.json
    )


def _power(args: argparse.Namespace) -> int:
    from healer.evals import power_bench

    return power_bench.main(args.nodes, args.speed, args.steady, args.seed, args.json, args.policy)
