"""The anomaly model inside the controller: loaded once, scored each tick, what it learned kept in KV.

Without ``controller.model`` there is no scorer and ``anomaly_score`` is 0. scikit-learn takes seconds
to import, so only a controller with a model pays for it (``healer.anomaly`` is imported here only
then). What the model learned (per-GPU and per-node baselines) is restored at start and saved by the
leader every ``anomaly_save_s`` and at stop, so a restart or a new leader does not warm up again.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import structlog

from healer import config, errors
from healer.controller.failslow import detector, straggler_settings
from healer.controller.inventory import topology
from healer.controller.observability import metrics as controller_metrics
from healer.controller.store import kv
from healer.schemas import shadow

if TYPE_CHECKING:  # scikit-learn takes seconds to import: only a controller with --model pays for it
    from healer.anomaly import scoring


COOLING_DOMAINS = ("cdu", "cooling_loop", "cooling", "rack")
"""Failure-domain keys that name what cools a node, most specific first: the anomaly model's
``thermal_peer`` compares a node with the nodes of its GPU model that share the first of these it has
(docs/anomaly.md); a node with none of them is compared with its GPU model's nodes fleet-wide."""


def cooling_domains(topo: topology.Topology) -> dict[str, str]:
    """Each node's cooling domain (``COOLING_DOMAINS``), as ``key=value``."""
    out: dict[str, str] = {}
    for key in reversed(COOLING_DOMAINS):  # a more specific key, later, replaces a broader one
        for value, nodes in topo.groups(key).items():
            for node in nodes:
                out[node] = f"{key}={value}"
    return out


class Learning:
    def __init__(
        self,
        cs: config.ControllerSettings,
        state: kv.Store,
        metrics: controller_metrics.ControllerMetrics,
        log: structlog.typing.FilteringBoundLogger,
        anomaly: config.AnomalySettings | None = None,
    ) -> None:
        self.cs = cs
        self.state = state
        self.metrics = metrics
        self.log = log
        self.scored_at = 0.0
        self.saved_at = time.monotonic()
        self.scorer: scoring.Scorer | scoring.NullScorer | None = None
        self._topology_seen: topology.Topology | None = None
        window = cs.straggler_window_s
        fs = straggler_settings.Settings(window_s=window, sample_every_s=window / 12)
        self.failslow = detector.FailSlow(fs) if cs.stragglers else None
        """Fail-slow detection (docs/fail-slow.md): on unless ``controller.stragglers`` is off."""
        if cs.model:
            from healer.anomaly import cfar, scoring

            a = anomaly or config.AnomalySettings()
            calibration = (
                cfar.CfarSettings(
                    budget_per_1000_node_days=a.false_alarm_budget, min_node_days=a.calibration_node_days
                )
                if a.calibration
                else None
            )
            self.scorer = scoring.load_or_null(
                cs.model, gpus_per_node=cs.gpus_per_node, calibration=calibration
            )
            loaded = isinstance(self.scorer, scoring.Scorer)
            metrics.anomaly_model_loaded.set(1 if loaded else 0)
            if not loaded:
                log.error("controller.anomaly_disabled", model=cs.model, anomaly_score=0)

    def watch_topology(self, topo: topology.Topology) -> None:
        """Give the anomaly model each node's cooling domain (``cooling_domains``) when the admitted
        fleet's topology changes (``Admission.topology`` returns the same object until it does)."""
        if topo is self._topology_seen:
            return
        self._topology_seen = topo
        scorer = self.learning_scorer()
        if scorer is not None:
            scorer.thermal.set_domains(cooling_domains(topo))

    def learning_scorer(self) -> scoring.Scorer | None:
        """The scorer when a model loaded (not the ``NullScorer`` of one that failed to)."""
        if self.scorer is None:
            return None
        from healer.anomaly import scoring  # imported already when a model is set

        return self.scorer if isinstance(self.scorer, scoring.Scorer) else None

    def score(self, now: float) -> dict[str, dict[int, float]] | None:
        """Per node, per GPU: the anomaly scores, every ``anomaly_interval_s`` (None between)."""
        if self.scorer is None or now - self.scored_at < self.cs.anomaly_interval_s:
            return None
        self.scored_at = now
        scores = self.scorer.score(now)
        self.metrics.anomaly_seconds.observe(self.scorer.last_cost_s)
        self._pool_metrics()
        return scores

    def _pool_metrics(self) -> None:
        """Each calibration pool's state, node-days, measured rate and thresholds on /metrics."""
        scorer = self.learning_scorer()
        if scorer is None or scorer.cfar is None:
            return
        m = self.metrics
        for p in scorer.cfar.status():
            pool = p["pool"]
            m.anomaly_pool_live.labels(pool).set(1 if p["state"] == "live" else 0)
            m.anomaly_pool_node_days.labels(pool).set(p["node_days"])
            m.anomaly_shadow.labels(pool)  # at 0 from the pool's first score, not "No data"
            rate = p["live_per_1000_node_days"]
            if p["state"] != "live" and p["node_days"] > 0:  # in shadow: the would-be rate
                rate = 1000 * p["shadow_incidents"] / p["node_days"]
            if rate is not None:
                m.anomaly_pool_rate.labels(pool).set(rate)
            for component, thr in p["thresholds"].items():
                m.anomaly_pool_threshold.labels(pool, component).set(thr)

    def shadow_events(self, cluster: str) -> list[shadow.ShadowEvent]:
        """The would-be incidents of pools in shadow since the last call, as feed events (counted)."""
        scorer = self.learning_scorer()
        if scorer is None:
            return []
        out = []
        for d in scorer.take_shadow():
            at = d.pop("at")
            self.metrics.anomaly_shadow.labels(d["pool"]).inc()
            out.append(shadow.build(cluster=cluster, data=shadow.ShadowData(**d), ts=at))
        return out

    def explain(self, node: str, gpu: int) -> dict[str, float | str]:
        """Which component scored high, against what (empty without a loaded model)."""
        scorer = self.learning_scorer()
        return scorer.explain(node, gpu) if scorer is not None else {}

    def components(self, node: str, gpu: int) -> dict[str, float] | None:
        """The anomaly model's components for one GPU at its last scoring (the status page's
        ``AnomalySource``); None without a loaded model or before the GPU was scored."""
        found = self.explain(node, gpu)
        comps = {k.removeprefix("component_"): v for k, v in found.items() if k.startswith("component_")}
        if not comps:
            return None
        return {"anomaly_score": float(found["anomaly_score"]), **{k: float(v) for k, v in comps.items()}}

    def save_due(self) -> bool:
        return time.monotonic() - self.saved_at >= self.cs.anomaly_save_s

    async def restore(self) -> None:
        """Start from what this fleet's model learned before (per-GPU and per-node baselines), so a
        restart or a new controller does not warm up again. A state of another format or GPU count is
        ignored (logged): the model learns again."""
        scorer = self.learning_scorer()
        if scorer is None:
            return
        from healer.anomaly import scorer_state as anomaly_state

        try:
            saved = await anomaly_state.load(self.state)
            nodes = scorer.import_state(saved) if saved is not None else 0
        except (errors.HealerError, ValueError) as e:
            self.log.warning("controller.anomaly_state_not_restored", error=str(e), detail="learning again")
            return
        self.log.info("controller.anomaly_state_restored", nodes=nodes)

    async def save(self) -> None:
        scorer = self.learning_scorer()
        self.saved_at = time.monotonic()
        if scorer is None:
            return
        from healer.anomaly import scorer_state as anomaly_state

        try:
            shards = await anomaly_state.save(self.state, scorer.export_state())
        except errors.HealerError as e:
            self.log.warning("controller.anomaly_state_not_saved", error=str(e))
            return
        self.log.debug("controller.anomaly_state_saved", shards=shards)
