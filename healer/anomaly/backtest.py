"""Backtest on any recording: replay recorded NodeFrames through the rule pack and the anomaly model(s)
as a controller would have seen them, and count what each would have opened.

An SRE's question before deploying: "what would this pack and this model have opened on my fleet last
week?". The input is NodeFrame v1 JSON lines, one frame per line, in arrival order (what ``healer
agent`` publishes and the ``HEALER_TELEMETRY`` stream keeps: plain, gzip, or ``-`` for standard input),
or the frames read from the stream itself. Each frame is decoded by the controller's own decoder
(``codec.decode_frame_view``); a frame that does not decode is counted by reason and skipped.

For each recording (each one starts cold, as a controller without saved state would):

- the **rules**: every condition rule of the pack except ``anomaly-score-high`` runs in one real
  ``rules.engine.Engine``, fed every frame, evaluated every ``eval_every_s`` of frame time;
- each **model**: a real ``scoring.Scorer`` (with ``calibration``, the controller's per-pool
  thresholds and shadow mode: ``cfar``), fed every frame, scored every ``score_every_s`` (the
  controller's ``anomaly_interval_s``) on the absolute grid plus ``score_offset_s`` (the scorer floors
  each call to its own grid, so the offset changes nothing); its scores go through the pack's
  ``anomaly-score-high`` hysteresis (``for``, ``resolve``, ``cooldown``: ``evaluation.Episodes``) and
  the rule's node-wide grouping (``grouping.NodeGrouper``: incidents as the controller opens them,
  beside the raw GPU firings), so several models are compared on one pass over the same frames.

With a ground-truth file (the shared generator's ``--truth`` format: ``{"faults": [{"kind", "node",
"gpu", "onset_ts", ...}]}``; ``gpu`` null for a node fault) each incident is true or false, and each
fault is caught or missed, with its latency after onset and its lead over the kind's static rule
(``STATIC_RULES``). Without one, every incident counts as opened on a healthy fleet. Rates are per
1,000 healthy node-days (a node is healthy from its first frame until its first fault's onset) with an
exact (Garwood) 95 % upper bound, so a run too short to show a low rate says so.

Anomaly incidents are also grouped into *node episodes*: incidents on one node that open within
``episode_gap_s`` of the previous one there are one episode (a node-wide event raising several GPU
incidents is one thing to look at).
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import itertools
import math
import pathlib
import statistics
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import IO, TYPE_CHECKING, Any, Final, cast

import numpy as np
import numpy.typing as npt
import orjson

from healer import errors
from healer.anomaly import grouping
from healer.rules import engine, ruleset
from healer.schemas import codec

if TYPE_CHECKING:  # scikit-learn is only needed when a model is replayed (``healer rules backtest``
    from healer.anomaly import model as anomaly_model  # runs without it)

ANOMALY_RULE: Final = "anomaly-score-high"
SCORE_THRESHOLD: Final = 0.9
"""``model.SCORE_THRESHOLD`` (a test keeps them equal), without importing scikit-learn."""
STATIC_RULES: Final = {
    "cooling_degradation": "gpu-temp-near-slowdown",
    "inlet_failure": "gpu-temp-near-slowdown",
    "node_cooling_loss": "gpu-temp-near-slowdown",
    "nvlink_crc_rising": "nvlink-crc-storm",
    "pcie_replay_storm": "pcie-replay-rate",
    "ecc_sbe_storm": "ecc-sbe-rate-high",
    "fail_slow": "gpu-straggler",
}
"""Per fault kind, the static rule a lead time is measured against (``evaluation.STATIC_RULES`` plus
the shared generators' ``node_cooling_loss``, and ``fail_slow``: the fail-slow scorer's rule)."""


@dataclasses.dataclass(frozen=True)
class Episodes:
    """How the anomaly rule turns scores into incidents (``evaluation.Episodes``, the same fields)."""

    hold_s: float = 120.0
    resolve_below: float = 0.6
    resolve_s: float = 900.0
    cooldown_s: float = 3600.0


def open_lines(path: str | pathlib.Path) -> tuple[IO[bytes], IO[bytes] | None]:
    """A binary stream over a JSON-lines recording, and the file under it to close (None for standard
    input): ``-`` is standard input; gzip is recognised by its magic bytes, whatever the file is
    called. The file is opened once and only peeked at, so a pipe (``<(generator ...)``) works as well
    as a file."""
    under: Any = None if str(path) == "-" else open(path, "rb")  # noqa: SIM115 (closed by read_lines)
    raw: Any = sys.stdin.buffer if under is None else under
    peek = raw.peek(2)[:2] if hasattr(raw, "peek") else b""
    return cast(IO[bytes], gzip.GzipFile(fileobj=raw) if peek == b"\x1f\x8b" else raw), under


def read_lines(path: str | pathlib.Path) -> Iterator[bytes]:
    """Each non-empty line of a recording (``open_lines``), without its newline."""
    fh, under = open_lines(path)
    try:
        for line in fh:
            line = line.strip()
            if line:
                yield line
    finally:
        if under is not None:
            fh.close()
            under.close()


def load_truth(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """Faults from a ground-truth file: the shared generator's ``--truth`` JSON (``faults`` with
    ``onset_ts``) or a list of healer simulator truth entries (``start``). Each comes back as
    ``{"kind", "node", "gpu", "start"}``; ``gpu`` is None for a node fault."""
    try:
        doc = orjson.loads(pathlib.Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise errors.PermanentError(f"{path}: cannot read the ground truth: {e}") from e
    rows = doc.get("faults", []) if isinstance(doc, dict) else doc
    out = []
    for f in rows:
        try:
            start = float(f["onset_ts"] if "onset_ts" in f else f["start"])
            gpu = f.get("gpu")
            out.append(
                {
                    "kind": str(f["kind"]),
                    "node": str(f["node"]),
                    "gpu": None if gpu is None else int(gpu),
                    "start": start,
                }
            )
        except (KeyError, TypeError, ValueError) as e:
            raise errors.PermanentError(f"{path}: a fault without kind, node or onset: {f!r}") from e
    return out


def upper95(k: int, exposure: float) -> float | None:
    """Exact (Garwood) two-sided 95 % upper bound of a Poisson rate: ``k`` events in ``exposure``
    (the rate whose chance of ``k`` or fewer events is 2.5 %; 3.69 for k = 0)."""
    if exposure <= 0:
        return None

    def cdf(lam: float) -> float:
        term = total = math.exp(-lam)
        for i in range(1, k + 1):
            term *= lam / i
            total += term
        return total

    lo, hi = float(k), float(k) + 10.0 + 10.0 * math.sqrt(k + 1)
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) > 0.025 else (lo, mid)
    return hi / exposure


@dataclasses.dataclass
class _Tracker:
    """The anomaly rule's hysteresis over one model's scores, per GPU (streaming ``Episodes``)."""

    ep: Any
    """``Episodes`` or ``evaluation.Episodes``: hold_s, resolve_below, resolve_s, cooldown_s."""
    gpus: int
    run_start: npt.NDArray[np.float64] = dataclasses.field(init=False)
    open_: npt.NDArray[np.bool_] = dataclasses.field(init=False)
    low_since: npt.NDArray[np.float64] = dataclasses.field(init=False)
    cool_until: npt.NDArray[np.float64] = dataclasses.field(init=False)
    closed: list[tuple[int, int]] = dataclasses.field(init=False, default_factory=list)
    """The (node row, gpu) whose incidents resolved at the last ``step``."""

    def __post_init__(self) -> None:
        shape = (0, self.gpus)
        self.run_start = np.full(shape, np.nan)
        self.open_ = np.zeros(shape, dtype=bool)
        self.low_since = np.full(shape, np.nan)
        self.cool_until = np.full(shape, -np.inf)

    def step(self, scores: npt.NDArray[np.float64], t: float) -> list[tuple[int, int]]:
        """Feed one scoring's (nodes, gpus) scores at ``t``; returns the (node row, gpu) that open."""
        n = len(scores)
        extra = n - len(self.run_start)
        if extra > 0:
            g = self.gpus
            self.run_start = np.concatenate([self.run_start, np.full((extra, g), np.nan)])
            self.open_ = np.concatenate([self.open_, np.zeros((extra, g), dtype=bool)])
            self.low_since = np.concatenate([self.low_since, np.full((extra, g), np.nan)])
            self.cool_until = np.concatenate([self.cool_until, np.full((extra, g), -np.inf)])
        high = scores >= SCORE_THRESHOLD
        low = scores < self.ep.resolve_below
        rs = self.run_start
        rs[high & np.isnan(rs)] = t
        rs[~high] = np.nan
        # open incidents: resolve after resolve_s below the level
        ls = self.low_since
        ls[self.open_ & low & np.isnan(ls)] = t
        ls[~low] = np.nan
        done = self.open_ & ~np.isnan(ls) & (t - ls >= self.ep.resolve_s)
        rows, cols = np.nonzero(done)
        self.closed = list(zip(rows.tolist(), cols.tolist(), strict=True))
        self.open_[done] = False
        self.cool_until[done] = t + self.ep.cooldown_s
        ls[done] = np.nan
        with np.errstate(invalid="ignore"):
            fire = ~self.open_ & high & (t - rs >= self.ep.hold_s) & (t >= self.cool_until)
        self.open_[fire] = True
        rows, cols = np.nonzero(fire)
        return list(zip(rows.tolist(), cols.tolist(), strict=True))


@dataclasses.dataclass
class Incident:
    node: str
    gpu: int | None
    at: float
    rule: str
    component: str = ""
    """For an anomaly incident: the component that drove the score when it opened."""


class Backtest:
    """One recording's replay: feed frames with ``feed`` (or ``run``), then ``result``."""

    def __init__(
        self,
        rules: ruleset.RuleSet | None,
        models: dict[str, anomaly_model.Model],
        *,
        episodes: Any = None,
        gpus_per_node: int = 8,
        score_every_s: float = 30.0,
        eval_every_s: float = 10.0,
        score_offset_s: float = 0.0,
        node_wide: ruleset.NodeWide | None = None,
        calibration: Any = None,
        failslow: Any = None,
    ) -> None:
        self.gpus = gpus_per_node
        self.failslow = failslow
        """The controller's fail-slow part (``observe(frame)``, ``tick(now)``: per node and GPU the
        straggler verdicts), whose verdicts reach the pack's ``gpu-straggler`` rule as in the controller."""
        kept = tuple(r for r in rules.rules if r.id != ANOMALY_RULE) if rules is not None else ()
        self.engine = (
            engine.Engine(ruleset.RuleSet(rules=kept, files=rules.files), gpus_per_node=gpus_per_node)
            if rules is not None
            else None
        )
        if models:
            from healer.anomaly import scoring
        self.scorers = {
            name: scoring.Scorer(m, {}, gpus_per_node=gpus_per_node, calibration=calibration)
            for name, m in models.items()
        }
        ep = episodes or Episodes()
        self.trackers = {name: _Tracker(ep, gpus_per_node) for name in models}
        anomaly_rule = rules.by_id(ANOMALY_RULE) if rules is not None else None
        nw = node_wide or (anomaly_rule.node_wide if anomaly_rule is not None else None)
        nw = nw or ruleset.NodeWide(group=ANOMALY_RULE)
        self.groupers = {
            name: grouping.NodeGrouper(
                gpus_per_node=gpus_per_node, fraction=nw.fraction, min_gpus=nw.min_gpus, within_s=nw.within_s
            )
            for name in models
        }
        self.model_incidents: dict[str, list[Incident]] = {name: [] for name in models}
        """Per model, the anomaly incidents as the controller opens them (node-wide grouping)."""
        self.score_every_s = score_every_s
        self.score_offset_s = score_offset_s
        """Scoring calls at the absolute grid of ``score_every_s`` plus this offset (the phase of the
        controller's timer; the scorer floors each call to its own grid, so this must not matter)."""
        self.eval_every_s = eval_every_s
        self.frames = 0
        self.bad: collections.Counter[str] = collections.Counter()
        self.first_seen: dict[str, float] = {}
        self.last_seen: dict[str, float] = {}
        self.rule_hits: list[Incident] = []
        self.model_hits: dict[str, list[Incident]] = {name: [] for name in models}
        self._now = -math.inf
        self._next_score: float | None = None
        self._next_eval: float | None = None

    def feed(self, data: bytes) -> None:
        try:
            frame = codec.decode_frame_view(data)
        except errors.DecodeError as e:
            self.bad[e.reason] += 1
            return
        # arrival order is the order of the recording; time never runs backwards
        now = self._now = max(self._now, float(frame.ts))
        self.frames += 1
        self.first_seen.setdefault(frame.node, now)
        self.last_seen[frame.node] = now
        if self._next_score is None:
            step, off = self.score_every_s, self.score_offset_s
            self._next_score = math.floor((now - off) / step) * step + off + step
            self._next_eval = now + self.eval_every_s
        if self.engine is not None:
            self.engine.ingest(frame, at=now)
        if self.failslow is not None:
            self.failslow.observe(frame)
        for s in self.scorers.values():
            s.observe(frame, at=now)
        assert self._next_eval is not None
        if now >= self._next_score:
            self._score(now)
            step = self.score_every_s
            self._next_score += step * (math.floor((now - self._next_score) / step) + 1)
        if now >= self._next_eval:
            self._evaluate(now)
            self._next_eval = now + self.eval_every_s

    def run(self, lines: Iterable[bytes]) -> Backtest:
        for data in lines:
            self.feed(data)
        return self

    def _score(self, now: float) -> None:
        for name, s in self.scorers.items():
            arr, valid = s.score_array(now)
            at = s.scored_at if s.scored_at is not None else now
            arr = np.where(valid, arr, 0.0)
            tracker, grouper = self.trackers[name], self.groupers[name]
            opened = tracker.step(arr, at)
            for i, g in tracker.closed:
                grouper.leave(s.window.node_names[i], g)
            for i, g in opened:
                comps = {k: float(v[i, g]) for k, v in s.last_components.items()}
                top = max(comps, key=lambda k: comps[k]) if comps else ""
                node = s.window.node_names[i]
                self.model_hits[name].append(Incident(node, g, at, ANOMALY_RULE, top))
                if grouper.join(node, g, at) is not None:
                    self.model_incidents[name].append(Incident(node, g, at, ANOMALY_RULE, top))

    def _evaluate(self, now: float) -> None:
        if self.engine is None:
            return
        verdicts = self.failslow.tick(now) if self.failslow is not None else None
        for node, per_gpu in (verdicts or {}).items():
            self.engine.set_straggler_scores(node, per_gpu)
        for f in self.engine.evaluate(now):
            if f.status == "fired":
                self.rule_hits.append(Incident(f.node, f.gpu, now, f.rule.id))

    # ------------------------------------------------------------------ results

    def result(
        self, truth: list[dict[str, Any]] | None = None, *, episode_gap_s: float = 300.0
    ) -> dict[str, Any]:
        """Raw per-recording outcome (``summarize`` adds recordings up)."""
        truth = truth or []
        healthy_s = 0.0
        for node, first in self.first_seen.items():
            onset = min((f["start"] for f in truth if f["node"] == node), default=math.inf)
            healthy_s += max(0.0, min(onset, self.last_seen[node]) - first)
        end = max(self.last_seen.values(), default=0.0)
        out_models = {}
        for name, hits in self.model_hits.items():
            false = [h for h in hits if _is_false(h, truth)]
            grouped = self.model_incidents[name]
            false_grouped = [h for h in grouped if _is_false(h, truth)]
            out_models[name] = {
                "incidents": len(hits),
                "false": len(false),
                "controller_incidents": len(grouped),
                "false_controller": len(false_grouped),
                "false_controller_by_component": dict(
                    collections.Counter(h.component for h in false_grouped)
                ),
                "false_by_component": dict(collections.Counter(h.component for h in false)),
                "false_node_episodes": _episodes(false, episode_gap_s),
                "node_episodes": _episodes(hits, episode_gap_s),
                "faults": [_fault_outcome(f, hits, self.rule_hits, end) for f in truth],
                "false_detail": [dataclasses.asdict(h) for h in false[:50]],
            }
        per_rule: dict[str, dict[str, int]] = collections.defaultdict(lambda: {"incidents": 0, "false": 0})
        for h in self.rule_hits:
            per_rule[h.rule]["incidents"] += 1
            per_rule[h.rule]["false"] += int(_is_false(h, truth))
        return {
            "frames": self.frames,
            "bad_frames": dict(self.bad),
            "nodes": len(self.first_seen),
            "span_s": end - min(self.first_seen.values(), default=end),
            "healthy_node_days": healthy_s / 86400.0,
            "with_rules": self.engine is not None,
            "rules": dict(per_rule),
            "models": out_models,
            "rule_faults": [_fault_outcome(f, [], self.rule_hits, end) for f in truth],
            "faults": truth,
        }


def _is_false(h: Incident, truth: list[dict[str, Any]]) -> bool:
    return not any(
        f["node"] == h.node
        and f["start"] <= h.at
        and (f["gpu"] is None or h.gpu is None or f["gpu"] == h.gpu)
        for f in truth
    )


def _episodes(hits: list[Incident], gap_s: float) -> int:
    by_node: dict[str, list[float]] = collections.defaultdict(list)
    for h in hits:
        by_node[h.node].append(h.at)
    n = 0
    for ts in by_node.values():
        ts.sort()
        n += 1 + sum(b - a > gap_s for a, b in itertools.pairwise(ts))
    return n


def _first(hits: Iterable[Incident], f: dict[str, Any], rule: str | None = None) -> float | None:
    ts = [
        h.at
        for h in hits
        if h.node == f["node"]
        and h.at >= f["start"]
        and (rule is None or h.rule == rule)
        and (f["gpu"] is None or h.gpu is None or h.gpu == f["gpu"])
    ]
    return min(ts) if ts else None


def _fault_outcome(
    f: dict[str, Any], model_hits: list[Incident], rule_hits: list[Incident], end: float
) -> dict[str, Any]:
    m = _first(model_hits, f)
    static_rule = STATIC_RULES.get(f["kind"])
    s = _first(rule_hits, f, static_rule) if static_rule else None
    r = _first(rule_hits, f)
    return {
        "kind": f["kind"],
        "node": f["node"],
        "gpu": f["gpu"],
        "model_s": None if m is None else m - f["start"],
        "static_rule": static_rule,
        "static_rule_s": None if s is None else s - f["start"],
        "any_rule_s": None if r is None else r - f["start"],
        "until_end_s": end - f["start"],
    }


def _ahead(fs: list[dict[str, Any]], margin_s: float) -> int:
    """Faults caught at least ``margin_s`` before the static rule (or before the recording ended, where
    the static rule never fired)."""
    n = 0
    for f in fs:
        if f["model_s"] is None:
            continue
        ref = f["static_rule_s"] if f["static_rule_s"] is not None else f["until_end_s"]
        if ref - f["model_s"] >= margin_s and (margin_s > 0 or ref > f["model_s"]):
            n += 1
    return n


def _rate(k: int, days: float) -> dict[str, float | int | None]:
    up = upper95(k, days)
    return {
        "count": k,
        "per_1000_node_days": 1000.0 * k / days if days > 0 else None,
        "upper95_per_1000_node_days": None if up is None else 1000.0 * up,
    }


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures over several recordings: per model (false incidents and node episodes per 1,000 healthy
    node-days with the 95 % upper bound, and per fault kind catches, latency and lead over the static
    rule), per rule (false firings per 1,000 healthy node-days)."""
    days = sum(r["healthy_node_days"] for r in results)
    rule_days = sum(r["healthy_node_days"] for r in results if r["with_rules"])
    models: dict[str, Any] = {}
    for name in results[0]["models"] if results else []:
        rs = [r["models"][name] for r in results]
        kinds: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        for r in rs:
            for f in r["faults"]:
                kinds[f["kind"]].append(f)
        per_kind = {}
        for kind, fs in sorted(kinds.items()):
            caught = [f for f in fs if f["model_s"] is not None]
            static = [f for f in caught if f["static_rule_s"] is not None]
            per_kind[kind] = {
                "faults": len(fs),
                "caught": len(caught),
                "recall": len(caught) / len(fs),
                "median_latency_s": statistics.median(f["model_s"] for f in caught) if caught else None,
                "static_rule": STATIC_RULES.get(kind),
                "static_rule_caught": sum(f["static_rule_s"] is not None for f in fs),
                "any_rule_caught": sum(f["any_rule_s"] is not None for f in fs),
                "before_static": _ahead(fs, 0.0),
                "ge_10min_before_static": _ahead(fs, 600.0),
                "share_before_static": _ahead(fs, 0.0) / len(fs),
                "share_ge_10min_before_static": _ahead(fs, 600.0) / len(fs),
                "median_lead_vs_static_s": (
                    statistics.median(f["static_rule_s"] - f["model_s"] for f in static) if static else None
                ),
            }
        comp: collections.Counter[str] = collections.Counter()
        for r in rs:
            comp.update(r["false_by_component"])
        models[name] = {
            "incidents": sum(r["incidents"] for r in rs),
            "false_incidents": _rate(sum(r["false"] for r in rs), days),
            "false_node_episodes": _rate(sum(r["false_node_episodes"] for r in rs), days),
            "false_controller_incidents": _rate(sum(r.get("false_controller", 0) for r in rs), days),
            "false_by_component": dict(comp),
            "per_kind": per_kind,
        }
    rules: dict[str, Any] = {}
    for r in results:
        for rid, v in r["rules"].items():
            e = rules.setdefault(rid, {"incidents": 0, "false": 0})
            e["incidents"] += v["incidents"]
            e["false"] += v["false"]
    for v in rules.values():
        v["false_rate"] = _rate(v["false"], rule_days)
    rule_kinds: dict[str, dict[str, Any]] = {}
    for r in results:
        for f in r["rule_faults"]:
            e = rule_kinds.setdefault(
                f["kind"],
                {"faults": 0, "static_rule": f["static_rule"], "static_rule_caught": 0, "any_rule_caught": 0},
            )
            e["faults"] += 1
            e["static_rule_caught"] += f["static_rule_s"] is not None
            e["any_rule_caught"] += f["any_rule_s"] is not None
    bad: collections.Counter[str] = collections.Counter()
    for r in results:
        bad.update(r["bad_frames"])
    return {
        "recordings": len(results),
        "frames": sum(r["frames"] for r in results),
        "bad_frames": dict(bad),
        "nodes": sum(r["nodes"] for r in results),
        "healthy_node_days": days,
        "faults": sum(len(r["faults"]) for r in results),
        "models": models,
        "rules": dict(sorted(rules.items())),
        "rules_per_kind": dict(sorted(rule_kinds.items())),
        "rules_false_total": _rate(sum(v["false"] for v in rules.values()), rule_days) if rule_days else None,
    }


def _m(v: float | None) -> str:
    return "-" if v is None else f"{v / 60:.1f}"


def _r(rate: dict[str, Any]) -> str:
    per = rate["per_1000_node_days"]
    up = rate["upper95_per_1000_node_days"]
    if per is None:
        return f"{rate['count']} (no healthy node-days)"
    return f"{rate['count']} ({per:.1f} per 1,000 node-days, 95 % upper bound {up:.1f})"


def format_summary(s: dict[str, Any]) -> str:
    """The human-readable form of ``summarize``'s result."""
    lines = [
        f"recordings {s['recordings']}, frames {s['frames']}, nodes {s['nodes']}, "
        f"healthy node-days {s['healthy_node_days']:.2f}, faults {s['faults']}"
        + (
            f", undecodable frames {sum(s['bad_frames'].values())} {s['bad_frames']}"
            if s["bad_frames"]
            else ""
        )
    ]
    for name, m in s["models"].items():
        lines.append("")
        lines.append(f"model {name}: anomaly incidents {m['incidents']}")
        lines.append(f"  false incidents      {_r(m['false_incidents'])}")
        lines.append(f"  false node episodes  {_r(m['false_node_episodes'])}")
        lines.append(f"  false incidents (node-wide grouping) {_r(m['false_controller_incidents'])}")
        if m["false_by_component"]:
            lines.append(
                "  false by component   "
                + ", ".join(f"{k} {v}" for k, v in sorted(m["false_by_component"].items()))
            )
        if m["per_kind"]:
            lines.append(
                f"  {'fault kind':<22} {'n':>3} {'caught':>6} {'median min':>10} {'static rule':<24} "
                f"{'rule':>4} {'before':>6} {'>=10m':>5} {'lead min':>8}"
            )
            for kind, k in m["per_kind"].items():
                lines.append(
                    f"  {kind:<22} {k['faults']:>3} {k['caught']:>6} {_m(k['median_latency_s']):>10} "
                    f"{k['static_rule'] or '-':<24} {k['static_rule_caught']:>4} {k['before_static']:>6} "
                    f"{k['ge_10min_before_static']:>5} {_m(k['median_lead_vs_static_s']):>8}"
                )
    if s["rules"]:
        lines.append("")
        lines.append(
            f"{'rule':<32} {'incidents':>9} {'false':>6}  false per 1,000 healthy node-days (95 % upper)"
        )
        for rid, v in s["rules"].items():
            fr = v["false_rate"]
            per = fr["per_1000_node_days"]
            up = fr["upper95_per_1000_node_days"]
            lines.append(
                f"{rid:<32} {v['incidents']:>9} {v['false']:>6}  "
                + ("-" if per is None else f"{per:.1f} ({up:.1f})")
            )
    if s.get("rules_per_kind"):
        lines.append("")
        lines.append(f"{'fault kind (rules)':<22} {'n':>3} {'static rule':<24} {'caught':>6} {'any rule':>8}")
        for kind, k in s["rules_per_kind"].items():
            lines.append(
                f"{kind:<22} {k['faults']:>3} {k['static_rule'] or '-':<24} {k['static_rule_caught']:>6} "
                f"{k['any_rule_caught']:>8}"
            )
    if s.get("rules_false_total"):
        lines.append(f"every rule but the anomaly rule: false incidents {_r(s['rules_false_total'])}")
    return "\n".join(lines)


def run_sources(
    sources: list[Iterable[bytes]],
    truths: list[list[dict[str, Any]]] | Callable[[int], list[dict[str, Any]]],
    rules: ruleset.RuleSet | None,
    models: dict[str, anomaly_model.Model],
    *,
    episodes: Any = None,
    gpus_per_node: int = 8,
    score_every_s: float = 30.0,
    eval_every_s: float = 10.0,
    calibration: Any = None,
    failslow: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Replay each source (cold: a new engine, new scorers and a new ``failslow()`` per source) with
    its ground truth (``truths[k]``, empty for none; or ``truths(k)``, called once source ``k`` has
    been replayed, so a generator piping its frames may write its truth file as it starts) and
    summarize; ``raw`` holds each recording's own result."""
    raw = []
    for k, src in enumerate(sources):
        bt = Backtest(
            rules,
            models,
            episodes=episodes,
            gpus_per_node=gpus_per_node,
            score_every_s=score_every_s,
            eval_every_s=eval_every_s,
            calibration=calibration,
            failslow=failslow() if failslow is not None else None,
        ).run(src)
        truth = truths(k) if callable(truths) else truths[k] if k < len(truths) else []
        raw.append(bt.result(truth))
    return summarize(raw) | {"raw": raw}
