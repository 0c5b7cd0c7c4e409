"""The ``healer`` command. Each command group lives in its own module with a ``register(subparsers)``.

Every command that talks to NATS takes ``--nats`` (default ``HEALER_NATS_URL`` or
nats://127.0.0.1:4222). Exit codes: 0 success, 1 the command found a problem (a rule file with errors,
a failed check), 2 bad usage.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

import healer

GROUPS = [
    "healer.cli.demo_cmd",
    "healer.cli.agent_cmd",
    "healer.cli.controller_cmd",
    "healer.cli.nats_cmd",
    "healer.cli.telemetry_cmd",
    "healer.cli.feed_cmd",
    "healer.cli.alertmanager_cmd",
    "healer.cli.act_cmd",
    "healer.cli.bench_cmd",
    "healer.cli.config_cmd",
    "healer.cli.schema_cmd",
    "healer.cli.sim_cmd",
    "healer.cli.rules_cmd",
    "healer.cli.model_cmd",
    "healer.cli.ui_cmd",
]
"""Modules that add subcommands, in help order."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="healer", description="Self-healing agent for GPU datacenters")
    parser.add_argument("--version", action="version", version=f"healer {healer.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in GROUPS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return 0
