"""``healer schema export``: write the JSON Schema of every wire document."""

from __future__ import annotations

import argparse
import pathlib
from typing import Any

from healer.cli import common
from healer.schemas import export


def register(sub: Any) -> None:
    parser = sub.add_parser("schema", help="wire-format JSON Schemas")
    schema_sub = parser.add_subparsers(dest="schema_command", metavar="ACTION")
    schema_sub.required = True
    exp = schema_sub.add_parser("export", help="write docs/schemas/*.json")
    exp.add_argument("--out", default="docs/schemas", type=pathlib.Path, help="directory (%(default)s)")
    exp.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    try:
        paths = export.write(args.out)
    except OSError as e:
        raise common.SettingsError(f"cannot write to {args.out} (--out): {e.strerror or e}") from e
    for path in paths:
        print(path)
    return 0
