"""The controller's Prometheus metrics (names are part of the contract: deploy/grafana uses them)."""

from __future__ import annotations

import prometheus_client as prom


class ControllerMetrics:
    def __init__(self, registry: prom.CollectorRegistry | None = None) -> None:
        self.registry = registry or prom.CollectorRegistry()
        r = self.registry
        self.frames = prom.Counter(
            "healer_controller_frames_ingested_total", "NodeFrames ingested", registry=r
        )
        self.events = prom.Counter(
            "healer_controller_events_ingested_total", "NodeEvents ingested", registry=r
        )
        self.decode_errors = prom.Counter(
            "healer_controller_decode_errors_total", "rejected messages", ["kind", "reason"], registry=r
        )
        self.tick = prom.Histogram(
            "healer_controller_tick_seconds",
            "one evaluation tick (rules over the fleet, incident handling)",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=r,
        )
        self.evaluations = prom.Counter(
            "healer_controller_rule_evaluations_total", "rule evaluations (rules x ticks)", registry=r
        )
        self.incidents_open = prom.Gauge(
            "healer_controller_incidents_open", "open incidents", ["severity"], registry=r
        )
        self.incident_changes = prom.Counter(
            "healer_controller_incident_events_total", "feed events published", ["change"], registry=r
        )
        self.actions = prom.Counter(
            "healer_controller_actions_total", "actions by kind and result", ["kind", "result"], registry=r
        )
        self.breaker_open = prom.Gauge(
            "healer_controller_breaker_open", "1 while the breaker is open", registry=r
        )
        self.lag = prom.Histogram(
            "healer_controller_lag_seconds",
            "receive time minus frame timestamp",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0),
            registry=r,
        )
        self.events_pending = prom.Gauge(
            "healer_controller_events_unacked", "events received and not yet acknowledged", registry=r
        )
        self.leader = prom.Gauge(
            "healer_controller_leader", "1 while this process holds the lease", registry=r
        )
        self.rules_loaded = prom.Gauge("healer_controller_rules_loaded", "rules active", registry=r)
        self.rules_rejected = prom.Counter(
            "healer_controller_rules_rejected_total", "rule reloads rejected for errors", registry=r
        )
        self.anomaly_seconds = prom.Histogram(
            "healer_controller_anomaly_score_seconds",
            "CPU seconds of one batched anomaly scoring pass over the fleet",
            buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=r,
        )
        self.anomaly_model_loaded = prom.Gauge(
            "healer_controller_anomaly_model_loaded",
            "1 when an anomaly model is loaded and scoring",
            registry=r,
        )
        self.fleet_nodes = prom.Gauge("healer_controller_fleet_nodes", "nodes seen by this shard", registry=r)
