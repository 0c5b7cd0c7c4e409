"""False alarms and detection of the rule pack and the anomaly model on the shared fleet generators.

Streams each shared fleet's ``gen.py`` (``../shared/fleets/<fleet>/gen.py``, NodeFrame JSON lines on a
pipe, never stored) through the controller's decoder, the default rule pack's engine, one cold
``scoring.Scorer``, the anomaly rule's hysteresis and node-wide grouping, and the controller's
fail-slow part feeding the pack's ``gpu-straggler`` rule (``evals.backtest``, as ``healer model eval
--recorded`` does), one run per fleet and seed, and prints per fleet and seed:

- healthy runs: false anomaly incidents as GPU firings, as the controller opens them (node-wide
  grouping), as node episodes, per 1,000 healthy node-days with the exact 95 % upper bound, the
  component that drove them, the shadow would-be incidents (a pool not calibrated yet), and the false
  incidents of every other rule;
- fault runs (``--faults``): per fault kind, caught by the model / by any rule, and the median delay
  from onset.

Seeds below 1000 are for tuning; 1000 and up for a final figure only, reported apart (the output says
which). The generator runs under ``nice``; keep runs small while developing (8-12 nodes x 6-12 h).

    .venv/bin/python benchmarks/anomaly_fleets.py --fleet h200-a100-mixed --seeds 11 12 --nodes 8 --hours 6
    .venv/bin/python benchmarks/anomaly_fleets.py --fleet h100-independent --faults --seeds 21 \
        --nodes 12 --hours 9
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
FLEETS_DIR = REPO.parent / "shared" / "fleets"
FLEETS = ("h100-independent", "h200-a100-mixed")
FAULT_KINDS = {
    "h100-independent": ("cooling_degradation", "node_cooling_loss", "nvlink_crc_rising"),
    # fail_slow is the fail-slow scorer's (``gpu-straggler``), run as the controller runs it
    "h200-a100-mixed": ("coolant_flow", "tim_degradation", "fan_failure", "nvlink_degradation", "fail_slow"),
}


def gen_command(
    fleet: str, seed: int, nodes: int, hours: float, faults: list[str], truth: str | None
) -> list[str]:
    gen = FLEETS_DIR / fleet / "gen.py"
    span = ["--minutes", str(hours * 60)] if fleet == "h100-independent" else ["--hours", str(hours)]
    cmd = ["nice", "-n", "10", sys.executable, str(gen), "--nodes", str(nodes), *span, "--seed", str(seed)]
    for k in faults:
        cmd += ["--fault", k]
    if truth:
        cmd += ["--truth", truth]
    return [*cmd, "--out", "-"]


def lines_of(cmd: list[str]) -> Iterator[bytes]:
    with subprocess.Popen(cmd, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.strip()
            if line:
                yield line
        if proc.wait() != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}")


def run_one(
    fleet: str,
    seed: int,
    args: argparse.Namespace,
    rules: Any,
    model: Any,
    episodes: Any,
    *,
    faults_on: bool = False,
    calibrated: dict[str, Any] | None = None,
    hours: float | None = None,
) -> dict[str, Any]:
    """One cold run (``calibrated``: a pool calibration to start from, as a deployment that has
    watched this fleet healthy before)."""
    from healer import config
    from healer.anomaly import cfar
    from healer.cli import model_cmd
    from healer.evals import backtest, backtest_input

    # the controller's fail-slow part, as the controller builds it
    failslow = model_cmd.failslow_factory(config.ControllerSettings()) or (lambda: None)

    faults: list[str] = []
    if faults_on:
        kinds = list(FAULT_KINDS[fleet])
        faults = [kinds[i % len(kinds)] for i in range(min(args.nodes, args.per_kind * len(kinds)))]
    with tempfile.TemporaryDirectory() as tmp:
        truth_path = str(pathlib.Path(tmp) / "truth.json") if faults else None
        cmd = gen_command(fleet, seed, args.nodes, hours or args.hours, faults, truth_path)
        started = time.process_time()
        settings = (
            cfar.CfarSettings(budget_per_1000_node_days=args.budget, min_node_days=args.min_node_days)
            if args.calibration == "on"
            else None
        )
        bt = backtest.Backtest(
            rules,
            {"model": model},
            episodes=episodes,
            score_every_s=args.score_every,
            calibration=settings,
            failslow=failslow(),
        )
        scorer = bt.scorers["model"]
        if calibrated is not None and scorer.cfar is not None:
            scorer.cfar.import_(calibrated)
            scorer.cfar.frozen = args.hold_calibration
        trace = Trace(scorer) if args.dump and scorer.cfar is not None else None
        bt.run(lines_of(cmd))
        if trace is not None:
            trace.save(args.dump / f"{fleet}-{seed}{'-faults' if faults_on else ''}.npz")
        truth = backtest_input.load_truth(truth_path) if truth_path else []
        out = bt.result(truth)
    out["fleet"], out["seed"] = fleet, seed
    out["cpu_s"] = time.process_time() - started
    out["shadow"] = scorer.shadow_counts
    out["pools"] = scorer.cfar.status() if scorer.cfar is not None else []
    out["calibration"] = scorer.cfar.export() if scorer.cfar is not None else None
    return out


class Trace:
    """``--dump``: every scoring instant's per-GPU deciding components (after the forest's
    corroboration, as the calibration sees them) and raw counters value, to study the fleet's tails
    offline (``numpy.load``: ``lifted`` (steps, components, nodes, gpus), ``counters_raw``, ``at``,
    ``scored``, ``node_pool``, ``pools``, ``nodes``)."""

    def __init__(self, scorer: Any) -> None:
        import numpy as np

        self.np = np
        self.scorer = scorer
        self.lifted: list[Any] = []
        self.raw: list[Any] = []
        self.at: list[float] = []
        self.scored: list[Any] = []
        cal, hold = scorer.cfar, scorer.counter_hold
        decide, step = cal.decide, hold.step

        def traced_decide(lifted: Any, scored: Any, at: float, dt: float) -> Any:
            self.lifted.append(lifted.astype(np.float32))
            self.scored.append(scored.copy())
            self.at.append(at)
            return decide(lifted, scored, at, dt)

        def traced_step(value: Any) -> Any:
            self.raw.append(value.astype(np.float32))
            return step(value)

        cal.decide, hold.step = traced_decide, traced_step

    def save(self, path: pathlib.Path) -> None:
        np = self.np
        n = max((len(v) for v in self.scored), default=0)

        def pad(a: Any, axis: int) -> Any:
            widths = [(0, 0)] * a.ndim
            widths[axis] = (0, n - a.shape[axis])
            return np.pad(a, widths)

        cal = self.scorer.cfar
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(
            path,
            lifted=np.stack([pad(v, 1) for v in self.lifted]),
            counters_raw=np.stack([pad(v, 0) for v in self.raw]),
            at=np.array(self.at),
            scored=np.stack([pad(v, 0) for v in self.scored]),
            node_pool=cal.node_pool[:n],
            pools=np.array(cal.pools),
            nodes=np.array(self.scorer.window.node_names[:n]),
        )


def pool_lines(r: dict[str, Any]) -> list[str]:
    out = []
    for p in r["pools"]:
        thr = " ".join(f"{k.replace('thermal_', 't_')} {v:g}" for k, v in p["thresholds"].items())
        out.append(
            f"    pool {p['pool']:<30} {p['state']:<6} {p['node_days']:6.2f} node-days, shadow "
            f"{p['shadow_incidents']}, live {p['live_incidents']} in {p['live_node_days']:.2f}; {thr}"
        )
    return out


def healthy_line(r: dict[str, Any]) -> str:
    from healer.evals import backtest_figures

    m = r["models"]["model"]
    days = r["healthy_node_days"]

    def per(k: int) -> str:
        return f"{1000 * k / days:8.0f}" if days > 0 else "       -"

    up = backtest_figures.upper95(m["false_controller"], days) if days > 0 else None
    other = sum(v["false"] for rid, v in r["rules"].items())
    shadow = sum(r["shadow"].values()) if r["shadow"] else 0
    return (
        f"{r['fleet']:<17} {r['seed']:>5} {days:7.2f} {m['false']:>6} {per(m['false'])} "
        f"{m['false_controller']:>6} {per(m['false_controller'])} "
        f"{'-' if up is None else f'{1000 * up:8.0f}'} {m['false_node_episodes']:>6} {shadow:>6} {other:>6}  "
        + ", ".join(f"{k} {v}" for k, v in sorted(m["false_controller_by_component"].items()))
    )


def fault_lines(results: list[dict[str, Any]]) -> list[str]:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        for f in r["models"]["model"]["faults"]:
            kinds.setdefault(f["kind"], []).append(f)
    out = [
        f"{'fault kind':<22} {'n':>3} {'model':>5} {'median min':>10} {'any rule':>8} {'median min':>10} "
        f"{'static':>6}"
    ]
    for kind, fs in sorted(kinds.items()):
        caught = [f["model_s"] for f in fs if f["model_s"] is not None]
        med = f"{statistics.median(caught) / 60:.1f}" if caught else "-"
        any_rule = sum(f["any_rule_s"] is not None or f["model_s"] is not None for f in fs)
        static = sum(f["static_rule_s"] is not None for f in fs)
        first = [
            min(v for v in (f["any_rule_s"], f["model_s"]) if v is not None)
            for f in fs
            if f["any_rule_s"] is not None or f["model_s"] is not None
        ]
        any_med = f"{statistics.median(first) / 60:.1f}" if first else "-"
        out.append(
            f"{kind:<22} {len(fs):>3} {len(caught):>5} {med:>10} {any_rule:>8} {any_med:>10} {static:>6}"
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleet", nargs="+", choices=FLEETS, default=list(FLEETS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[11])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--faults", action="store_true", help="inject faults (one per node) and score detection")
    ap.add_argument("--per-kind", type=int, default=2, help="faults of each kind per run (with --faults)")
    ap.add_argument("--model", type=pathlib.Path, default=REPO / "models" / "default")
    ap.add_argument("--rules", nargs="+", default=[str(REPO / "rules")])
    ap.add_argument("--score-every", type=float, default=30.0)
    ap.add_argument("--json", type=pathlib.Path, help="also write every run's raw result here")
    ap.add_argument(
        "--dump", type=pathlib.Path, help="write each run's per-instant deciding components here (npz)"
    )
    ap.add_argument("--calibration", choices=("on", "off"), default="on", help="per-pool thresholds (cfar)")
    ap.add_argument("--budget", type=float, default=1.0, help="false incidents per 1,000 node-days")
    ap.add_argument("--min-node-days", type=float, default=2.0, help="calibration before a pool is live")
    ap.add_argument(
        "--hold-calibration",
        action="store_true",
        help="(with --calibrate-from) hold the healthy calibration during the fault runs instead of "
        "learning on (one fault per node: most nodes of the run fail, which no fleet's normal is)",
    )
    ap.add_argument(
        "--calibrate-from",
        type=int,
        metavar="SEED",
        help="(with --faults) first watch this healthy seed, same nodes and hours, and start each fault "
        "run from its pool calibration (a deployment that has watched the fleet before)",
    )
    ap.add_argument(
        "--calibrate-hours",
        type=float,
        help="(with --calibrate-from) hours of that healthy run (default: --hours): a deployment that has "
        "watched its fleet this long",
    )
    args = ap.parse_args()

    from healer.anomaly import persist
    from healer.cli import model_cmd
    from healer.evals import backtest_figures
    from healer.rules import loader

    loaded = loader.load_paths([pathlib.Path(p) for p in args.rules])
    if loaded.ruleset is None:
        print("rule pack has errors", file=sys.stderr)
        return 1
    model = persist.load(args.model)[0]
    episodes = model_cmd.anomaly_episodes(args.rules, None)
    results = []
    final = [s for s in args.seeds if s >= 1000]
    if final and len(final) != len(args.seeds):
        print("seeds below and from 1000 are reported apart: run them separately", file=sys.stderr)
        return 2
    print(f"seeds {'>= 1000 (final figures)' if final else '< 1000 (tuning)'}: {args.seeds}")
    if not args.faults:
        print(
            f"{'fleet':<17} {'seed':>5} {'n-days':>7} {'gpu':>6} {'/1000':>8} {'incid':>6} {'/1000':>8} "
            f"{'up95':>8} {'episd':>6} {'shadow':>6} {'rules':>6}  driving component"
        )
    for fleet in args.fleet:
        calibrated = None
        if args.faults and args.calibrate_from is not None:
            warm = run_one(
                fleet, args.calibrate_from, args, loaded.ruleset, model, episodes, hours=args.calibrate_hours
            )
            calibrated = warm["calibration"]
            print(
                f"{fleet}: calibrated on healthy seed {args.calibrate_from} "
                f"({args.nodes} nodes x {args.calibrate_hours or args.hours} h):"
            )
            print("\n".join(pool_lines(warm)))
        for seed in args.seeds:
            r = run_one(
                fleet,
                seed,
                args,
                loaded.ruleset,
                model,
                episodes,
                faults_on=args.faults,
                calibrated=calibrated,
            )
            results.append(r)
            if not args.faults:
                print(healthy_line(r), flush=True)
            print("\n".join(pool_lines(r)), flush=True)
    if args.faults:
        for fleet in args.fleet:
            print(f"\n{fleet}, seeds {args.seeds}, {args.nodes} nodes x {args.hours} h, faults:")
            for line in fault_lines([r for r in results if r["fleet"] == fleet]):
                print(line)
            fr = [r for r in results if r["fleet"] == fleet]
            false = sum(r["models"]["model"]["false_controller"] for r in fr)
            print(f"false anomaly incidents (node-wide grouping) in these runs: {false}")
    else:
        for fleet in args.fleet:
            fr = [r for r in results if r["fleet"] == fleet]
            days = sum(r["healthy_node_days"] for r in fr)
            k = sum(r["models"]["model"]["false_controller"] for r in fr)
            other = sum(v["false"] for r in fr for v in r["rules"].values())
            up = backtest_figures.upper95(k + other, days)
            print(
                f"{fleet}: {days:.2f} healthy node-days (seeds {args.seeds}): {k} false anomaly incidents, "
                f"{other} from other rules; all rules {1000 * (k + other) / days:.1f} per 1,000 node-days "
                f"(95 % upper bound {1000 * (up or 0):.1f})"
            )
    cpu = sum(r["cpu_s"] for r in results)
    print(f"CPU of this process (decode, rules, scorer): {cpu:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
