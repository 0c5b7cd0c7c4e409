"""``healer rules check|test|schema``: the promtool-style tooling for rule files."""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import TYPE_CHECKING, Any

from healer.cli import common, lazy

if TYPE_CHECKING:  # the real modules, for mypy; at run time they load on first use (cli/lazy.py)
    from healer.rules import coverage, loader, ruletests, schema
else:
    coverage = lazy.module("healer.rules.coverage")
    loader = lazy.module("healer.rules.loader")
    ruletests = lazy.module("healer.rules.ruletests")
    schema = lazy.module("healer.rules.schema")


def register(sub: Any) -> None:
    parser = sub.add_parser("rules", help="check, test and describe rule files")
    rules_sub = parser.add_subparsers(dest="rules_command", metavar="ACTION")
    rules_sub.required = True

    check = rules_sub.add_parser("check", help="lint rule files: every error and warning at once")
    check.add_argument("paths", nargs="+", type=pathlib.Path, help="rule files or directories")
    check.add_argument("--strict", action="store_true", help="treat warnings as errors")
    check.set_defaults(func=_check)

    test = rules_sub.add_parser("test", help="run rule unit tests (promtool style)")
    test.add_argument("paths", nargs="+", type=pathlib.Path, help="test files or directories")
    test.set_defaults(func=_test)

    bt = rules_sub.add_parser(
        "backtest",
        help="replay recorded NodeFrames through the pack: what it would have opened (docs/rules.md)",
    )
    bt.add_argument("recorded", nargs="*", metavar="FILE", help="NodeFrame JSON lines (gzip ok; - = stdin)")
    bt.add_argument("--rules", nargs="+", default=["rules"], help="rule files or directories")
    bt.add_argument("--model", nargs="+", default=[], type=pathlib.Path, help="also replay these models")
    bt.add_argument("--json", action="store_true", help="print the figures as JSON")
    from healer.cli import model_cmd

    model_cmd.add_backtest_options(bt, models=False)
    bt.set_defaults(func=_backtest)

    sch = rules_sub.add_parser("schema", help="write the rule-file JSON Schema (for editors)")
    sch.add_argument("--out", type=pathlib.Path, help="file to write (default: standard output)")
    sch.set_defaults(func=_schema)


def _existing(paths: list[pathlib.Path], what: str) -> None:
    """A path that does not exist is a usage error (exit 2), not a failed check."""
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise common.SettingsError(f"no such file or directory: {', '.join(missing)} (the {what} to read)")


def _backtest(args: argparse.Namespace) -> int:
    from healer.cli import model_cmd

    if not args.recorded and not args.from_stream:
        raise common.SettingsError("healer rules backtest: give recorded files, - or --from-stream")
    return model_cmd.backtest(args, list(args.model))


def _check(args: argparse.Namespace) -> int:
    _existing(args.paths, "rule files or directories")
    result = loader.load_paths(args.paths)
    gaps = coverage.warnings(result.ruleset) if result.ruleset is not None else []
    for diag in [*result.diagnostics, *gaps]:
        print(diag)
    errors, warnings = len(result.errors), len(result.warnings) + len(gaps)
    failed = errors > 0 or (args.strict and warnings > 0)
    if result.ruleset is not None:
        count = f"{len(result.ruleset.rules)} rules in {len(result.ruleset.files)} files"
    else:
        count = f"{len(loader.expand(args.paths))} files"
    print(f"{'FAILED' if failed else 'OK'}: {count}, {errors} errors, {warnings} warnings")
    return 1 if failed else 0


def _test(args: argparse.Namespace) -> int:
    _existing(args.paths, "rule test files or directories")
    results = ruletests.run_paths(args.paths)
    failed = [r for r in results if not r.ok]
    for r in results:
        print(f"{'PASS' if r.ok else 'FAIL'}  {r.file}: {r.name}")
        for failure in r.failures:
            print("      " + failure.replace("\n", "\n      "))
    print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed or not results else 0


def _schema(args: argparse.Namespace) -> int:
    if args.out is None:
        sys.stdout.write(schema.render())
    else:
        print(schema.write(args.out))
    return 0
