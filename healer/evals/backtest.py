"""Backtest on any recording: replay recorded NodeFrames through the rule pack and the anomaly model(s)
as a controller would have seen them, and count what each would have opened.

An SRE's question before deploying: "what would this pack and this model have opened on my fleet last
week?". The input is NodeFrame v1 JSON lines, one frame per line, in arrival order (what ``healer
agent`` publishes and the ``HEALER_TELEMETRY`` stream keeps: plain, gzip, or ``-`` for standard input),
or the frames read from the stream itself (``backtest_input`` opens them and reads ground truth). Each
frame is decoded by the controller's own decoder (``codec.decode_frame_view``); a frame that does not
decode is counted by reason and skipped.

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
(``backtest_figures.STATIC_RULES``). Without one, every incident counts as opened on a healthy fleet.
Rates are per 1,000 healthy node-days (a node is healthy from its first frame until its first fault's
onset) with an exact (Garwood) 95 % upper bound, so a run too short to show a low rate says so.

Anomaly incidents are also grouped into *node episodes*: incidents on one node that open within
``episode_gap_s`` of the previous one there are one episode (a node-wide event raising several GPU
incidents is one thing to look at). ``backtest_figures`` computes and prints the figures.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from healer import errors
from healer.evals import backtest_figures, grouping
from healer.rules import engine, ruleset
from healer.schemas import codec

if TYPE_CHECKING:  # scikit-learn is only needed when a model is replayed (``healer rules backtest``
    from healer.anomaly import model as anomaly_model  # runs without it)

ANOMALY_RULE: Final = "anomaly-score-high"
SCORE_THRESHOLD: Final = 0.9
"""``model.SCORE_THRESHOLD`` (a test keeps them equal), without importing scikit-learn."""


@dataclasses.dataclass(frozen=True)
class Episodes:
    """How the anomaly rule turns scores into incidents (``evaluation.Episodes``, the same fields)."""

    hold_s: float = 120.0
    resolve_below: float = 0.6
    resolve_s: float = 900.0
    cooldown_s: float = 3600.0


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
        self.model_incidents: dict[str, list[backtest_figures.Incident]] = {name: [] for name in models}
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
        self.rule_hits: list[backtest_figures.Incident] = []
        self.model_hits: dict[str, list[backtest_figures.Incident]] = {name: [] for name in models}
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
                self.model_hits[name].append(backtest_figures.Incident(node, g, at, ANOMALY_RULE, top))
                if grouper.join(node, g, at) is not None:
                    self.model_incidents[name].append(
                        backtest_figures.Incident(node, g, at, ANOMALY_RULE, top)
                    )

    def _evaluate(self, now: float) -> None:
        if self.engine is None:
            return
        verdicts = self.failslow.tick(now) if self.failslow is not None else None
        for node, per_gpu in (verdicts or {}).items():
            self.engine.set_straggler_scores(node, per_gpu)
        for f in self.engine.evaluate(now):
            if f.status == engine.Status.FIRED:
                self.rule_hits.append(backtest_figures.Incident(f.node, f.gpu, now, f.rule.id))

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
            false = [h for h in hits if backtest_figures.is_false(h, truth)]
            grouped = self.model_incidents[name]
            false_grouped = [h for h in grouped if backtest_figures.is_false(h, truth)]
            out_models[name] = {
                "incidents": len(hits),
                "false": len(false),
                "controller_incidents": len(grouped),
                "false_controller": len(false_grouped),
                "false_controller_by_component": dict(
                    collections.Counter(h.component for h in false_grouped)
                ),
                "false_by_component": dict(collections.Counter(h.component for h in false)),
                "false_node_episodes": backtest_figures.node_episodes(false, episode_gap_s),
                "node_episodes": backtest_figures.node_episodes(hits, episode_gap_s),
                "faults": [backtest_figures.fault_outcome(f, hits, self.rule_hits, end) for f in truth],
                "false_detail": [dataclasses.asdict(h) for h in false[:50]],
            }
        per_rule: dict[str, dict[str, int]] = collections.defaultdict(lambda: {"incidents": 0, "false": 0})
        for h in self.rule_hits:
            per_rule[h.rule]["incidents"] += 1
            per_rule[h.rule]["false"] += int(backtest_figures.is_false(h, truth))
        return {
            "frames": self.frames,
            "bad_frames": dict(self.bad),
            "nodes": len(self.first_seen),
            "span_s": end - min(self.first_seen.values(), default=end),
            "healthy_node_days": healthy_s / 86400.0,
            "with_rules": self.engine is not None,
            "rules": dict(per_rule),
            "models": out_models,
            "rule_faults": [backtest_figures.fault_outcome(f, [], self.rule_hits, end) for f in truth],
            "faults": truth,
        }


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
    return backtest_figures.summarize(raw) | {"raw": raw}
