"""``healer model train|eval|calibrate|info``: train the anomaly model, measure it on simulated faults, show
it (``healer model status``: healer/cli/model_status.py)."""

from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import sys
from collections.abc import Callable
from typing import Any

from healer import config, errors, logs
from healer.bus import subjects
from healer.cli import common, model_status, model_summary

# scikit-learn, skops and the rule engine are imported inside the commands, so that every other
# ``healer`` command starts without them.
DEFAULT_SCENARIOS = "random-healthy,random-cooling,random-inlet,random-nvlink"
ANOMALY_RULE = "anomaly-score-high"
DEFAULT_HOLD_S = 300.0
"""The hold when the rule pack has no anomaly rule (the default pack's is 5 minutes)."""


def anomaly_episodes(rules_paths: list[str], hold_s: float | None) -> Any:
    """``evaluation.Episodes`` from the pack's anomaly rule: its ``for`` (unless ``hold_s`` is given),
    the threshold and ``for`` of its ``resolve`` and its ``cooldown``, so ``model eval`` counts
    incidents as the controller would open them."""
    import re

    from healer.evals import model_eval as evaluation
    from healer.rules import loader

    result = loader.load_paths([pathlib.Path(p) for p in rules_paths])
    rule = result.ruleset.by_id(ANOMALY_RULE) if result.ruleset is not None else None
    if rule is None:
        return evaluation.Episodes(hold_s=DEFAULT_HOLD_S if hold_s is None else hold_s)
    below = re.fullmatch(r"\s*anomaly_score\s*<\s*([0-9.]+)\s*", rule.resolve_text or "")
    return evaluation.Episodes(
        hold_s=rule.for_s if hold_s is None else hold_s,
        resolve_below=float(below.group(1)) if below else evaluation.Episodes().resolve_below,
        resolve_s=rule.resolve_for_s,
        cooldown_s=rule.cooldown_s,
    )


def anomaly_hold_s(rules_paths: list[str]) -> float:
    """What the rule pack makes of the score: the ``for`` of its anomaly rule, so ``model eval``
    counts incidents as the controller would raise them."""
    from healer.rules import loader

    result = loader.load_paths([pathlib.Path(p) for p in rules_paths])
    rule = result.ruleset.by_id(ANOMALY_RULE) if result.ruleset is not None else None
    return rule.for_s if rule is not None else DEFAULT_HOLD_S


"""The same as ``healer.evals.model_eval.EVAL_SCENARIOS`` (a test keeps them equal)."""


def register(sub: Any) -> None:
    parser = sub.add_parser("model", help="anomaly model: train, evaluate, show its card")
    msub = parser.add_subparsers(dest="model_command", metavar="ACTION")
    msub.required = True
    _add_train(msub)
    _add_eval(msub)
    _add_calibrate(msub)
    model_status.add_parser(msub)
    info = msub.add_parser("info", help="print the model card")
    info.add_argument("path", type=pathlib.Path)
    info.add_argument("--check", action="store_true", help="also load the model; exit 1 if it does not fit")
    info.set_defaults(func=_info)


def _add_train(msub: Any) -> None:
    tr = msub.add_parser("train", help="train on recorded healthy telemetry")
    src = tr.add_mutually_exclusive_group(required=True)
    src.add_argument("--from", dest="from_files", nargs="+", type=pathlib.Path, help="sim recordings (.npz)")
    src.add_argument("--from-stream", metavar="NATS_URL", help="read the HEALER_TELEMETRY stream")
    tr.add_argument("--prefix", help="subject prefix (with --from-stream; default: nats.prefix, healer)")
    common.add_config_option(tr)
    tr.add_argument("--limit", type=int, default=0, help="at most this many frames from the stream")
    tr.add_argument("--out", required=True, type=pathlib.Path, help="model directory (models/NAME)")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--trees", type=int, default=200, help="IsolationForest trees (%(default)s)")
    tr.add_argument("--max-rows", type=int, default=200_000, help="GPU-windows used for fitting")
    tr.add_argument("--window", type=float, default=300.0, help="window seconds (%(default)s)")
    tr.add_argument("--bucket", type=float, default=30.0, help="bucket / scoring seconds (%(default)s)")
    tr.add_argument("--gpus-per-node", type=int, default=8)
    tr.set_defaults(func=_train)


def _add_eval(msub: Any) -> None:
    ev = msub.add_parser(
        "eval",
        help="replay labelled simulated scenarios, or recorded NodeFrames (--recorded, --from-stream), "
        "through the model and the rules",
    )
    ev.add_argument("--model", required=True, type=pathlib.Path)
    add_backtest_options(ev, models=True)
    ev.add_argument(
        "--scenarios",
        default=DEFAULT_SCENARIOS,
        help="comma-separated scenario names or YAML files (%(default)s)",
    )
    ev.add_argument("--nodes", type=int, default=16)
    ev.add_argument("--hours", type=float, default=3.0)
    ev.add_argument("--seed", type=int, default=1000, help="first scenario seed (+1 per scenario)")
    ev.add_argument("--interval", type=float, default=5.0, help="simulated seconds per frame")
    ev.add_argument("--rules", nargs="+", default=["rules"], help="rule files or directories")
    ev.add_argument(
        "--hold",
        type=float,
        default=None,
        help="seconds at >= 0.9 before an incident (default: the `for` of anomaly-score-high in --rules)",
    )
    ev.add_argument("--no-rules", action="store_true", help="model only (long healthy runs)")
    ev.add_argument("--json", action="store_true", help="print the full result as JSON")
    ev.add_argument("--write-card", action="store_true", help="store the summary in the model card")
    ev.add_argument(
        "--plots",
        type=pathlib.Path,
        metavar="DIR",
        help="write PNGs here: lead time per fault kind, healthy margin per component, score traces",
    )
    ev.set_defaults(func=_eval)


def _add_calibrate(msub: Any) -> None:
    cal = msub.add_parser(
        "calibrate", help="learn this fleet's thermal baselines from recorded telemetry (state file)"
    )
    cal.add_argument("--model", required=True, type=pathlib.Path)
    csrc = cal.add_mutually_exclusive_group(required=True)
    csrc.add_argument("--from", dest="from_files", nargs="+", type=pathlib.Path, help="sim recordings (.npz)")
    csrc.add_argument("--from-stream", metavar="NATS_URL", help="read the HEALER_TELEMETRY stream")
    cal.add_argument("--prefix", help="subject prefix (with --from-stream; default: nats.prefix, healer)")
    common.add_config_option(cal)
    cal.add_argument("--limit", type=int, default=0, help="at most this many frames from the stream")
    cal.add_argument("--gpus-per-node", type=int, default=8)
    cal.add_argument("--state", type=pathlib.Path, help="continue from this state file")
    cal.add_argument("--out", required=True, type=pathlib.Path, help="state file to write (JSON)")
    cal.set_defaults(func=_calibrate)


def _bar(what: str) -> Any:
    """A progress callback ``(done, total)``: rich's bar on a terminal, one line at the end otherwise."""
    from rich import console, progress

    bar: dict[str, Any] = {}

    def show(done: int, total: int) -> None:
        if not sys.stderr.isatty():
            if done == total:
                print(f"{what}: {done}/{total}", file=sys.stderr)
            return
        if "p" not in bar:
            bar["p"] = progress.Progress(transient=False, console=console.Console(stderr=True))
            bar["p"].start()
            bar["task"] = bar["p"].add_task(what, total=total)
        bar["p"].update(bar["task"], completed=done, total=total)
        if done >= total:
            bar["p"].stop()

    return show


def _train(args: argparse.Namespace) -> int:
    from healer.anomaly import model as anomaly_model
    from healer.anomaly import training

    settings = anomaly_model.TrainSettings(
        window_s=args.window,
        bucket_s=args.bucket,
        n_estimators=args.trees,
        seed=args.seed,
        max_rows=args.max_rows,
    )
    try:
        wins = _windows(args, args.window, args.bucket)
        if wins is None:
            return common.EXIT_INTERRUPTED
        command = (
            "healer model " + " ".join(shlex.quote(a) for a in sys.argv[2:])
            if sys.argv[1:2] == ["model"]
            else "healer model train"
        )
        _, card = training.train(wins, args.out, settings, command)
    except common.SettingsError:
        raise
    except errors.HealerError as e:
        print(f"healer model train: {e}", file=sys.stderr)
        return 1
    print(
        json.dumps(
            {
                "out": str(args.out),
                "threshold": card["calibration"]["threshold"],
                "gpu_windows": card["training_data"]["gpu_windows"],
            }
        )
    )
    return 0


def _windows(args: argparse.Namespace, window_s: float, bucket_s: float) -> list[Any] | None:
    """Window features from ``--from`` recordings or ``--from-stream`` (train and calibrate); None when
    a signal stopped the stream read."""
    from healer.anomaly import dataset

    if args.from_files:
        return [
            dataset.from_recording(p, window_s=window_s, bucket_s=bucket_s, progress=_bar(str(p)))
            for p in args.from_files
        ]
    s = common.settings(args, nats={"url": args.from_stream})
    logs.configure("error")  # stdout is for the result; a failure is one line on stderr
    frames = common.run(
        lambda stop: common.until_stopped(
            dataset.stream_frames(
                lambda: common.connect(s, "healer-model"),
                subjects.Subjects(s.nats.prefix),
                limit=args.limit,
                progress=_bar("frames"),
            ),
            stop,
        )
    )
    if frames is None:
        return None
    win, bad = dataset.from_frames(
        frames,
        gpus_per_node=args.gpus_per_node,
        window_s=window_s,
        bucket_s=bucket_s,
        source=f"stream:{subjects.Subjects(s.nats.prefix).stream_telemetry}",
    )
    if bad:
        print(f"skipped {bad} undecodable frames", file=sys.stderr)
    return [win]


def _calibrate(args: argparse.Namespace) -> int:
    from healer.anomaly import calibration, persist

    try:
        m, _ = persist.load(args.model)
        initial = json.loads(args.state.read_text()) if args.state else None
        wins = _windows(args, m.settings.window_s, m.settings.bucket_s)
        if wins is None:
            return common.EXIT_INTERRUPTED
        state, summary = calibration.calibrate(m, wins, initial)
        args.out.write_text(json.dumps(state))
    except (errors.HealerError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"out": str(args.out), **summary}))
    return 0


def _eval(args: argparse.Namespace) -> int:
    from healer.anomaly import persist
    from healer.evals import model_eval as evaluation

    if args.recorded or args.from_stream:
        return backtest(args, [args.model, *args.compare])
    if args.plots is not None:
        try:
            from healer.anomaly import plots
        except ModuleNotFoundError as e:
            raise common.SettingsError(f"--plots needs {e.name}: pip install 'healer[plots]'") from e

    episodes = anomaly_episodes(args.rules, args.hold)
    hold_s = episodes.hold_s
    print(
        f"incident after {hold_s:g} s at >= 0.9, resolved after {episodes.resolve_s:g} s below "
        f"{episodes.resolve_below:g}, cooldown {episodes.cooldown_s:g} s",
        file=sys.stderr,
    )
    try:
        m, card = persist.load(args.model)
        names = [n for n in args.scenarios.split(",") if n]
        result = evaluation.run(
            m,
            names,
            nodes=args.nodes,
            hours=args.hours,
            seed=args.seed,
            interval_s=args.interval,
            rules_paths=args.rules,
            hold_s=hold_s,
            episodes=episodes,
            with_rules=not args.no_rules,
            traces=4 if args.plots is not None else 0,
            progress=lambda n: print(f"scenario {n} ...", file=sys.stderr),
        )
    except errors.HealerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.write_card:
        card["evaluation"] = {
            "command": "healer model " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
            **{k: v for k, v in result.items() if k != "raw"},
        }
        persist.write_card(args.model, card)
    if args.plots is not None:
        for path in plots.write(result, args.plots):
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=2, default=float))
    else:
        print(model_summary.format_summary(result))
    return 0


def add_backtest_options(p: argparse.ArgumentParser, *, models: bool) -> None:
    """The options of a backtest on recorded NodeFrames (``healer model eval``, ``healer rules
    backtest``)."""
    if models:  # ``healer rules backtest`` takes them as positional arguments
        p.add_argument(
            "--recorded",
            nargs="+",
            default=[],
            metavar="FILE",
            help="NodeFrame JSON lines (plain or gzip; - for standard input); each replayed cold",
        )
    p.add_argument("--from-stream", metavar="NATS_URL", help="replay the HEALER_TELEMETRY stream")
    p.add_argument("--prefix", help="subject prefix (with --from-stream; default: nats.prefix, healer)")
    p.add_argument("--limit", type=int, default=0, help="at most this many frames from the stream")
    p.add_argument(
        "--truth",
        nargs="+",
        default=[],
        metavar="FILE",
        help="ground truth per recording, in order (the shared generator's --truth JSON)",
    )
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--score-every", type=float, default=30.0, help="seconds between scorings (%(default)s)")
    p.add_argument(
        "--calibration",
        choices=("on", "off"),
        default=None,
        help="per-pool thresholds from the recording's own tail, shadow until calibrated, as the "
        "controller runs them (default: anomaly.calibration, on)",
    )
    p.add_argument(
        "--calibration-node-days",
        type=float,
        default=None,
        help="node-days a pool watches in shadow before it opens incidents (anomaly.calibration_node_days)",
    )
    if models:
        p.add_argument(
            "--compare",
            nargs="+",
            default=[],
            type=pathlib.Path,
            metavar="MODEL",
            help="also replay these models on the same frames (with --recorded / --from-stream)",
        )
    if "--config" not in p._option_string_actions:
        common.add_config_option(p)


def failslow_factory(cs: config.ControllerSettings) -> Callable[[], Any] | None:
    """A new fail-slow part per replay, as the controller builds it (``controller.stragglers``,
    ``controller.straggler_window_s``); None when the controller would not run it."""
    if not cs.stragglers:
        return None
    from healer.controller.failslow import detector, straggler_settings

    window = cs.straggler_window_s
    return lambda: detector.FailSlow(straggler_settings.Settings(window_s=window, sample_every_s=window / 12))


def backtest(args: argparse.Namespace, model_paths: list[pathlib.Path]) -> int:
    """Replay recorded NodeFrames through the rule pack and the models; print the figures."""
    from healer.evals import backtest_figures, backtest_input
    from healer.evals.backtest import run_sources
    from healer.rules import loader

    if args.truth and len(args.truth) != max(1, len(args.recorded)):
        raise common.SettingsError("--truth: give one ground-truth file per recording, in order")
    episodes = anomaly_episodes(args.rules, getattr(args, "hold", None))
    result = loader.load_paths([pathlib.Path(p) for p in args.rules])
    if result.ruleset is None:
        print("error: rule pack has errors: " + "; ".join(d.message for d in result.errors), file=sys.stderr)
        return 1
    cal = getattr(args, "calibration", None)
    settings = common.settings(
        args,
        anomaly={
            "calibration": None if cal is None else cal == "on",
            "calibration_node_days": getattr(args, "calibration_node_days", None),
        },
    )
    a = settings.anomaly
    calibration: Any = None
    if a.calibration and model_paths:
        from healer.anomaly import cfar

        calibration = cfar.CfarSettings(
            budget_per_1000_node_days=a.false_alarm_budget, min_node_days=a.calibration_node_days
        )
    try:
        models: dict[str, Any] = {}
        if model_paths:
            from healer.anomaly import persist

            for path in model_paths:
                models[str(path)] = persist.load(path)[0]

        def truths(k: int) -> list[dict[str, Any]]:  # read after the replay: a pipe's writer may be late
            return backtest_input.load_truth(args.truth[k]) if k < len(args.truth) else []

        sources: list[Any]
        if args.from_stream:
            frames = _stream(args)
            if frames is None:
                return common.EXIT_INTERRUPTED
            sources = [frames]
        else:
            sources = [backtest_input.read_lines(p) for p in args.recorded]
        out = run_sources(
            sources,
            truths,
            None if getattr(args, "no_rules", False) else result.ruleset,
            models,
            episodes=episodes,
            gpus_per_node=args.gpus_per_node,
            score_every_s=args.score_every,
            calibration=calibration,
            failslow=failslow_factory(settings.controller),
        )
    except (errors.HealerError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({k: v for k, v in out.items() if k != "raw"}, indent=2, default=float))
    else:
        print(backtest_figures.format_summary(out))
    return 0


def _stream(args: argparse.Namespace) -> list[bytes] | None:
    from healer.anomaly import dataset

    s = common.settings(args, nats={"url": args.from_stream})
    logs.configure("error")
    frames: list[bytes] | None = common.run(
        lambda stop: common.until_stopped(
            dataset.stream_frames(
                lambda: common.connect(s, "healer-backtest"),
                subjects.Subjects(args.prefix or s.nats.prefix),
                limit=args.limit,
                progress=_bar("frames"),
            ),
            stop,
        )
    )
    return frames


def _info(args: argparse.Namespace) -> int:
    from healer.anomaly import persist

    try:
        card = persist.read_card(args.path)
        if args.check:
            persist.load(args.path)
    except persist.ModelMismatchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(card, indent=2, ensure_ascii=False))
    return 0
