"""``healer config show|docs``: the effective settings, and the generated settings reference."""

from __future__ import annotations

import argparse
from typing import Any

import yaml

from healer import config, errors
from healer.cli import common


def register(sub: Any) -> None:
    p = sub.add_parser("config", help="settings")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION")
    csub.required = True
    show = csub.add_parser("show", help="print the effective settings (defaults, file, environment)")
    common.add_config_option(show)
    show.set_defaults(func=_show)
    docs = csub.add_parser("docs", help="print docs/configuration.md")
    docs.set_defaults(func=_docs)


def _show(args: argparse.Namespace) -> int:
    try:
        settings = config.load(args.config)
    except errors.PermanentError as e:
        raise common.SettingsError(f"{e} (--config / HEALER_CONFIG)") from e
    print(yaml.safe_dump(settings.model_dump(mode="json"), sort_keys=False), end="")
    return 0


def _docs(args: argparse.Namespace) -> int:
    print(config.reference_markdown(), end="")
    return 0
