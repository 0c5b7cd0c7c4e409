"""From the agent's NVML XID event to the cordon's call at the scheduler actuator (#43, item 2), with
where each fault spent its time: real agent processes, a real nats-server, the real controller with a
10,000-node inventory (healer/evals/agent_xid.py says what runs and what each stage is).

    nice -n 10 .venv/bin/python benchmarks/agent_to_cordon.py [--processes 4] [--agents 25] [--gap-s 0.2]

``healer bench controller --agent-xid N`` reports the same figure beside the controller-receipt XID one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import structlog

from healer.evals import agent_xid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--agents", type=int, default=25, help="agents (nodes) per process")
    parser.add_argument("--gap-s", type=float, default=0.2, help="between two faults of one process")
    parser.add_argument("--json", action="store_true", help="every fault's stamps too")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    stamps = asyncio.run(agent_xid.run(args.processes, args.agents, args.gap_s))
    s = agent_xid.summarise(stamps)
    if args.json:
        print(json.dumps({"summary": s.__dict__, "stamps": stamps}, indent=2))
        return
    print(
        f"agent NVML XID -> cordon asked of the scheduler: {s.acted} of {s.faults} nodes, 10,000-node fleet"
    )
    if s.p50_s is not None:
        ms = [round(1000 * (v or 0), 1) for v in (s.p50_s, s.p99_s, s.max_s)]
        print(f"p50 {ms[0]} ms  p99 {ms[1]} ms  max {ms[2]} ms")
    print("stage medians (ms, from the stage before):", s.stages_p50_ms)
    print("fetched while the controller's turn was held by (wait to evaluation, ms):", s.behind)
    for slow in s.slowest:
        print("slow:", slow)


if __name__ == "__main__":
    main()
