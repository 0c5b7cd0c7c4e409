"""``healer sim``, ``healer sim record``, ``healer sim scenarios|show`` and ``healer replay``.

``healer sim`` plays N node agents on NATS (frames, events, commands answered); ``healer sim record``
generates a recording faster than real time, with its ground truth; ``healer replay`` republishes a
recording. See docs/simulator.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import pathlib
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

import orjson

from healer import config, errors, logs
from healer.bus import provision, subjects
from healer.cli import common, lazy

if TYPE_CHECKING:  # the real modules, for mypy; at run time they load on first use (cli/lazy.py)
    from healer.agent import sim_fleet
    from healer.sim import recording, replay, scenarios, simulation, truth
else:
    simulation = lazy.module("healer.sim.simulation")
    sim_fleet = lazy.module("healer.agent.sim_fleet")
    recording = lazy.module("healer.sim.recording")
    replay = lazy.module("healer.sim.replay")
    scenarios = lazy.module("healer.sim.scenarios")
    truth = lazy.module("healer.sim.truth")


def _fleet_options(p: argparse.ArgumentParser, *, nodes: int) -> None:
    p.add_argument("--scenario", default="healthy", help="built-in name or YAML file (%(default)s)")
    p.add_argument("--nodes", type=int, default=nodes, help="simulated nodes (%(default)s)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (%(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed: same seed, same run (%(default)s)")
    p.add_argument(
        "--fault-rate-multiplier",
        type=float,
        default=None,
        help="scale the scenario's random fault rates (realistic: try 1000 for a short run)",
    )
    p.add_argument("--node-prefix", default="sim", help="node names are PREFIX-00000 ... (%(default)s)")
    p.add_argument("--truth", type=pathlib.Path, default=None, help="write ground truth here (JSON lines)")


def register(sub: Any) -> None:
    sim = sub.add_parser(
        "sim",
        help="simulated GPU fleet: live on NATS, or recorded to a file",
        description="Without an action: run N simulated node agents on NATS.",
    )
    common.add_nats_option(sim)
    _fleet_options(sim, nodes=10)
    sim.add_argument("--interval", type=float, default=1.0, help="seconds between frames (%(default)s)")
    sim.add_argument("--duration", type=float, default=0.0, help="seconds to run; 0 runs until stopped")
    sim.add_argument(
        "--provision", action="store_true", help="create the healer streams and buckets first (idempotent)"
    )
    sim.set_defaults(func=_live)
    actions = sim.add_subparsers(dest="sim_command", metavar="ACTION")

    rec = actions.add_parser("record", help="generate telemetry faster than real time into a file")
    _fleet_options(rec, nodes=100)
    rec.add_argument("--sim-hours", type=float, default=1.0, help="simulated hours (%(default)s)")
    rec.add_argument("--interval", type=float, default=1.0, help="simulated seconds per frame (%(default)s)")
    rec.add_argument("--out", type=pathlib.Path, required=True, help="recording file (.npz)")
    rec.add_argument("--start-ts", type=float, default=None, help="unix time the run starts (2026-01-01)")
    rec.set_defaults(func=_record)

    lst = actions.add_parser("scenarios", help="list the built-in scenarios")
    lst.set_defaults(func=_list)
    show = actions.add_parser("show", help="print a built-in scenario's YAML")
    show.add_argument("name")
    show.set_defaults(func=_show)

    rp = sub.add_parser("replay", help="republish a simulator recording on NATS")
    rp.add_argument("file", type=pathlib.Path)
    common.add_nats_option(rp)
    rp.add_argument("--speed", type=float, default=1.0, help="simulated seconds per second; 0: flat out")
    rp.add_argument("--keep-time", action="store_true", help="keep recorded timestamps (default: start now)")
    rp.set_defaults(func=_replay)


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except common.ConnectError as e:
            print(f"healer sim: {e}", file=sys.stderr)
            return 1
        except errors.PermanentError as e:
            print(f"healer: {e}", file=sys.stderr)
            return 2
        except errors.TemporaryError as e:
            print(f"healer: {e}", file=sys.stderr)
            return 1

    return run


def _build(args: argparse.Namespace, **kw: Any) -> simulation.Simulation:
    if args.nodes < 1 or args.gpus_per_node < 1:
        raise errors.PermanentError("--nodes and --gpus-per-node must be at least 1")
    if args.interval <= 0:
        raise errors.PermanentError("--interval must be more than 0 seconds")
    sc = scenarios.load(args.scenario)
    return scenarios.build(
        sc,
        nodes=args.nodes,
        gpus=args.gpus_per_node,
        seed=args.seed,
        fault_rate_multiplier=args.fault_rate_multiplier,
        names=scenarios.node_names(args.nodes, args.node_prefix),
        **kw,
    )


def _print(doc: dict[str, Any]) -> None:
    print(orjson.dumps(doc).decode())


@_guard
def _record(args: argparse.Namespace) -> int:
    logs.configure("warning")
    sim = _build(args, start_ts=args.start_ts)
    truth_path = args.truth or args.out.with_name(args.out.name + ".truth.jsonl")
    t0 = time.perf_counter()
    meta = {"scenario": args.scenario, "seed": args.seed, "fault_rate_multiplier": args.fault_rate_multiplier}
    writer = recording.record(
        sim, args.out, duration_s=args.sim_hours * 3600.0, interval_s=args.interval, extra_meta=meta
    )
    elapsed = time.perf_counter() - t0
    with recording.Recording(args.out) as rec:
        records = rec.truth()
    truth.write(truth_path, records)
    _print(
        {
            "out": str(args.out),
            "truth": str(truth_path),
            "steps": writer.steps,
            "node_frames": writer.frames,
            "faults": len(records),
            "wall_s": round(elapsed, 2),
            "node_frames_per_s": round(writer.frames / max(elapsed, 1e-9)),
        }
    )
    return 0


@_guard
def _live(args: argparse.Namespace) -> int:
    s = common.settings(args)
    logs.configure("info")
    return common.run(lambda stop: _live_main(args, s, stop)) or 0


async def _live_main(args: argparse.Namespace, s: config.Settings, stop: asyncio.Event) -> int:
    sim = _build(args, start_ts=time.time(), run_id=scenarios.fresh_run_id())
    subj = subjects.Subjects(s.nats.prefix)
    bus = await common.until_stopped(common.connect(s, "healer-sim"), stop)
    truth_file: TextIO | None = args.truth.open("a") if args.truth else None

    def sink(records: list[dict[str, Any]]) -> None:
        if truth_file is not None:
            truth_file.write("".join(orjson.dumps(r).decode() + "\n" for r in records))
            truth_file.flush()

    try:
        if args.provision:
            await provision.ensure(bus, subj, s.nats)
        runner = sim_fleet.LiveFleet(sim, bus, subj, interval_s=args.interval, truth_sink=sink)
        await runner.start()
        stats = await runner.run(args.duration or None, stop)
        await runner.close()
    finally:
        await bus.close()
        if truth_file is not None:
            truth_file.close()
    _print(dataclasses.asdict(stats))
    return 0


@_guard
def _replay(args: argparse.Namespace) -> int:
    s = common.settings(args)
    logs.configure("warning")
    return common.run(lambda stop: _replay_main(args, s, stop)) or 0


async def _replay_main(args: argparse.Namespace, s: config.Settings, stop: asyncio.Event) -> int:
    subj = subjects.Subjects(s.nats.prefix)
    with recording.Recording(args.file) as rec:
        bus = await common.until_stopped(common.connect(s, "healer-replay"), stop)
        try:
            stats = await replay.replay(
                rec, bus, subj, speed=args.speed, rebase=not args.keep_time, stop=stop
            )
        finally:
            await bus.close()
    _print(dataclasses.asdict(stats))
    return 0


def _list(args: argparse.Namespace) -> int:
    for name in scenarios.builtin_names():
        print(f"{name:14} {scenarios.load(name).description}")
    return 0


@_guard
def _show(args: argparse.Namespace) -> int:
    if args.name not in scenarios.builtin_names():
        raise errors.PermanentError(f"no built-in scenario {args.name!r}")
    sys.stdout.write(scenarios.builtin_text(args.name))
    return 0
