"""``healer demo``: nats-server, controller and a simulated fleet in one command (``make demo``)."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import signal
import sys
from typing import TYPE_CHECKING, Any

from healer import errors, logs
from healer.cli import common, lazy

if TYPE_CHECKING:  # the real modules, for mypy; at run time they load on first use (cli/lazy.py)
    from healer.demo import session, stage, view, watch
else:
    session = lazy.module("healer.demo.session")
    stage = lazy.module("healer.demo.stage")
    view = lazy.module("healer.demo.view")
    watch = lazy.module("healer.demo.watch")

DESCRIPTION = """\
Starts an embedded nats-server, the controller (enforce mode, default rule pack, log actuator unless
--actuator slurm) and a simulated fleet (32 nodes x 8 GPUs) running a scripted scenario: a GPU overheats
and is power-capped until it cools, a DBE / XID 48 gets its node cordoned and its work migrated, NVLink CRC
errors and a silent node get cordoned, a GPU that clocks low and slows its 4-node job is named as a
straggler and its node drained, then a mass fault trips the circuit breaker. A live view shows it
on a terminal (plain lines otherwise); the run ends with a summary. Everything it started is stopped at
the end or on Ctrl-C."""


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run everything locally on a simulated fleet", description=DESCRIPTION)
    p.add_argument("--duration", type=float, default=150.0, help="seconds (default %(default)s)")
    p.add_argument("--nodes", type=int, default=32, help="simulated nodes (default %(default)s)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="default %(default)s")
    p.add_argument("--seed", type=int, default=0, help="simulator seed (default %(default)s)")
    p.add_argument("--scenario", help="scenario file (default: the demo's own, healer/demo/scenario.yaml)")
    p.add_argument("--rules", help="rule pack directory (default: rules/ of the checkout)")
    p.add_argument(
        "--overrides",
        help="directory of rules replacing the pack's rules of the same id (default: healer/demo/rules/, "
        "which shortens gpu-temp-near-slowdown's timing); '' for none",
    )
    p.add_argument("--actuator", choices=["log", "slurm"], default="log", help="default %(default)s")
    p.add_argument(
        "--slurm-nodes",
        default="gpu01,gpu02,gpu03,gpu04",
        help="with --actuator slurm: Slurm nodes standing in for the story's nodes (default %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print only the summary, as JSON, on stdout")
    common.add_config_option(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    live_view = not args.json and sys.stdout.isatty()
    held = io.StringIO()  # under the live view, errors are held and printed after it
    logs.configure("error", stream=held if live_view else None)
    opts = session.Options(
        duration_s=args.duration,
        nodes=args.nodes,
        gpus=args.gpus_per_node,
        seed=args.seed,
        scenario=args.scenario,
        rules=args.rules,
        overrides=args.overrides,
        actuator=args.actuator,
        config_file=args.config,
        slurm_nodes=tuple(n for n in args.slurm_nodes.split(",") if n),
    )
    if opts.nodes < 1 or opts.gpus < 1 or opts.duration_s <= 0:
        print("healer demo: --nodes, --gpus-per-node and --duration must be positive", file=sys.stderr)
        return common.EXIT_USAGE
    lines = sys.stderr if args.json else sys.stdout

    def say(line: str) -> None:
        print(line, file=lines, flush=True)

    try:
        summary = _with_live_view(opts) if live_view else asyncio.run(_main(opts, _printer(say), say))
    except stage.SetupError as e:
        print(f"healer demo: {e}", file=sys.stderr)
        return common.EXIT_USAGE
    except errors.HealerError as e:
        print(f"healer demo: {e}", file=sys.stderr)
        return common.EXIT_FAILED
    finally:
        if held.getvalue():
            print(held.getvalue(), file=sys.stderr, end="")
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(view.summary_text(summary), flush=True)
    return 0


async def _main(opts: session.Options, on_tick: session.Tick, say: Any) -> dict[str, Any]:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        return await session.run(opts, stop=stop, on_tick=on_tick, say=say)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


def _printer(say: Any, every_s: float = 15.0) -> session.Tick:
    last = [0.0]

    def tick(obs: watch.Observer, now: float) -> None:
        for at, line in obs.take_lines():
            say(f"[{at - obs.t0:6.1f}s] {line}")
        if now - last[0] >= every_s:
            last[0] = now
            say(view.status_line(obs, now))

    return tick


def _with_live_view(opts: session.Options) -> dict[str, Any]:
    from rich.console import Console
    from rich.live import Live

    console = Console()
    header = f"{opts.nodes} nodes x {opts.gpus} GPUs, enforce, {opts.actuator} actuator"
    with Live(console=console, refresh_per_second=4, transient=False) as lv:

        def tick(obs: watch.Observer, now: float) -> None:
            obs.take_lines()
            lv.update(view.render(obs, now, duration_s=opts.duration_s, header=header))

        return asyncio.run(_main(opts, tick, lambda line: lv.console.print(line, style="dim")))
