"""The controller's Prometheus metrics (names are part of the contract: deploy/grafana uses them)."""

from __future__ import annotations

import typing
from collections.abc import Iterator, Sequence

import numpy as np
import prometheus_client as prom
from prometheus_client import metrics_core

from healer import actions, buildinfo, metricdecl
from healer.schemas import codec, incidents


def batched(name: str, documentation: str, buckets: Sequence[float]) -> metricdecl.Declared[BatchedHistogram]:
    return metricdecl.Declared(lambda r: BatchedHistogram(name, documentation, buckets, registry=r))


class BatchedHistogram(prom.registry.Collector):
    """A Prometheus histogram for the per-frame hot path: ``observe`` only appends to a list, and
    ``fold`` (the controller calls it once per tick, on its event loop) turns the batch into bucket
    counts with numpy. A scrape therefore sees the histogram as of the last tick. prometheus_client's
    Histogram costs about 1 us per observation (a lock and a bucket search); this costs tens of ns."""

    def __init__(
        self, name: str, documentation: str, buckets: Sequence[float], *, registry: prom.CollectorRegistry
    ) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = np.array([*sorted(buckets), np.inf])
        self.counts = np.zeros(len(self.bounds), dtype=np.int64)
        self.sum = 0.0
        self.pending: list[float] = []
        registry.register(self)

    def observe(self, value: float) -> None:
        self.pending.append(value)

    def fold(self) -> None:
        batch, self.pending = self.pending, []
        if batch:
            values = np.asarray(batch, dtype=np.float64)
            # bucket i counts values <= bounds[i] (Prometheus "le"): the first bound not below the value
            where = np.searchsorted(self.bounds, values, side="left")
            self.counts += np.bincount(where, minlength=len(self.bounds))
            self.sum += float(values.sum())

    def collect(self) -> Iterator[metrics_core.Metric]:
        cumulative = np.cumsum(self.counts).tolist()
        labels = ["+Inf" if b == np.inf else repr(b) for b in self.bounds.tolist()]
        yield metrics_core.HistogramMetricFamily(
            self.name,
            self.documentation,
            buckets=list(zip(labels, cumulative, strict=True)),
            sum_value=self.sum,
        )


REPAIR_BUCKETS_S = (
    60.0,
    300.0,
    900.0,
    1800.0,
    3600.0,
    4 * 3600.0,
    12 * 3600.0,
    86400.0,
    2 * 86400.0,
    7 * 86400.0,
)
"""Repair-time buckets: a minute to a week (a replacement takes days)."""
BETWEEN_FAILURES_BUCKETS_S = tuple(h * 3600.0 for h in (1, 6, 24, 72, 168, 336, 720, 2160))
"""Time-between-failures buckets: an hour to 90 days (the incident stream's default retention)."""


class ControllerMetrics(metricdecl.MetricSet):
    """Every metric of the controller, declared once (``healer.metricdecl``); ``ControllerMetrics(registry)``
    registers them, with ``healer_build_info``, and starts the label sets known up front at zero."""

    frames = metricdecl.counter("healer_controller_frames_ingested_total", "NodeFrames ingested")
    frames_lax = metricdecl.counter(
        "healer_controller_frames_lax_total",
        "NodeFrames valid only after type coercion (e.g. 3.0 for an integer): they take the slow decode"
        " path; a rising count points at an agent that should be fixed",
    )
    frames_pending = metricdecl.gauge(
        "healer_controller_frames_pending", "frames received and not yet ingested (backlog), at the last tick"
    )
    frames_dropped = metricdecl.counter(
        "healer_controller_frames_dropped_total",
        "frames dropped because the backlog was full (controller.frames_buffer_mib): add shards",
    )
    frames_stale = metricdecl.counter(
        "healer_controller_frames_stale_total",
        "frames dropped as repeated or late by their node's (boot_id, seq): duplicate, late, old_boot"
        " (each starts at 0 when ingest starts)",
        ["reason"],
    )
    events = metricdecl.counter("healer_controller_events_ingested_total", "NodeEvents ingested")
    arrivals = metricdecl.counter(
        "healer_controller_event_arrivals_total",
        "events evaluated and acted on as they arrived, between ticks",
    )
    arrivals_in_tick = metricdecl.counter(
        "healer_controller_event_arrivals_in_tick_total",
        "of those, served between a tick's steps (they arrived while a tick ran)",
    )
    events_retried = metricdecl.counter(
        "healer_controller_events_retried_total",
        "events handed back to be evaluated again: the step that evaluated them failed before it "
        "recorded their decisions",
    )
    frame_arrivals = metricdecl.counter(
        "healer_controller_frame_arrivals_total",
        "arrival evaluations: the rules without for, on the nodes whose frames arrived, between ticks",
    )
    frame_arrival_firings = metricdecl.counter(
        "healer_controller_frame_arrival_firings_total",
        "firings they found, acted on at once instead of at the next tick",
    )
    frame_arrival_seconds = metricdecl.counter(
        "healer_controller_frame_arrival_seconds_total",
        "CPU time the arrival evaluations took (not their frames' flush, which the tick would do anyway)",
    )
    decode_errors = metricdecl.counter(
        "healer_controller_decode_errors_total", "rejected messages", ["kind", "reason"]
    )
    tick = metricdecl.histogram(
        "healer_controller_tick_seconds",
        "one evaluation tick (rules over the fleet, incident handling)",
        (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    )
    evaluations = metricdecl.counter(
        "healer_controller_rule_evaluations_total", "rule evaluations (rules x ticks)"
    )
    incidents_open = metricdecl.gauge("healer_controller_incidents_open", "open incidents", ["severity"])
    incident_changes = metricdecl.counter(
        "healer_controller_incident_events_total", "feed events published", ["change"]
    )
    # live reliability (#42; healer.controller.observability.repairs, docs/archive.md's definitions)
    repair_seconds = metricdecl.histogram(
        "healer_controller_repair_seconds",
        "fault incidents from open to resolved, observed as each resolves (kind: gpu, node, port)",
        REPAIR_BUCKETS_S, ["rule", "kind"],
    )  # fmt: skip
    time_between_failures = metricdecl.histogram(
        "healer_controller_time_between_failures_seconds",
        "time since the same GPU's (node's, port's) previous fault incident opened, observed as one opens",
        BETWEEN_FAILURES_BUCKETS_S, ["kind"],
    )  # fmt: skip
    fleet_health_score = metricdecl.gauge(
        "healer_controller_fleet_health_score",
        "100 x (1 - severity-weighted share of this controller's admitted GPUs held by open fault incidents)",
    )
    actions = metricdecl.counter(
        "healer_controller_actions_total", "actions by kind and result", ["kind", "result"]
    )
    breaker_open = metricdecl.gauge("healer_controller_breaker_open", "1 while the breaker is open")
    lag = batched(
        "healer_controller_lag_seconds",
        "receive time minus frame timestamp (folded in once per tick)",
        (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0),
    )
    events_pending = metricdecl.gauge(
        "healer_controller_events_unacked", "events received and not yet acknowledged"
    )
    leader = metricdecl.gauge(
        "healer_controller_leader",
        "1 while this process acts as leader (holds a lease renewed within half its TTL)",
    )
    nats_disconnects = metricdecl.counter(
        "healer_controller_nats_disconnects_total",
        "NATS connections lost (server gone, or this client cut off as a slow consumer), by connection",
        ["connection"],
    )
    task_failures = metricdecl.counter(
        "healer_controller_task_failures_total",
        "long-lived tasks (lease, leadership, events, ticks, housekeeping, feed) that failed (restarted);"
        " repeat-count: a repeat-fault history that could not be read (the incident opened unescalated)",
        ["task"],
    )
    takeover_failures = metricdecl.counter(
        "healer_controller_takeover_failures_total",
        "takeovers (loading incidents and exclusions after winning the lease) that failed (retried)",
    )
    events_fetch_failures = metricdecl.counter(
        "healer_controller_events_fetch_failures_total",
        "pulls from the events consumer that failed (no leader, server away, reconnecting)",
    )
    rules_loaded = metricdecl.gauge("healer_controller_rules_loaded", "rules active")
    lease_unheld = metricdecl.gauge(
        "healer_controller_lease_unheld_seconds",
        "seconds since this process last saw a holder of its shard's lease (itself or another); 0 while"
        " it holds it",
        ["shard"],
    )
    leaderless = metricdecl.gauge(
        "healer_controller_leaderless",
        "1 when this process has seen no holder of its shard's lease for longer than the lease TTL plus"
        " controller.leaderless_margin_s (min over a shard's controllers: the shard has no leader)",
        ["shard"],
    )
    js_store_used = metricdecl.gauge(
        "healer_jetstream_store_used_bytes", "JetStream file storage the account uses"
    )
    js_store_limit = metricdecl.gauge(
        "healer_jetstream_store_limit_bytes",
        "the account's JetStream storage limit; where it has none, what healer's streams reserve",
    )
    js_stream_bytes = metricdecl.gauge(
        "healer_jetstream_stream_bytes", "bytes held by each of healer's streams", ["stream"]
    )
    js_stream_limit = metricdecl.gauge(
        "healer_jetstream_stream_limit_bytes",
        "each stream's byte limit, reserved for it by the server (0: none, it can fill the store)",
        ["stream"],
    )
    js_storage_ok = metricdecl.gauge(
        "healer_jetstream_storage_ok",
        "0 while JetStream storage would refuse healer's writes or a stream has no byte limit",
    )
    label_refresh_failures = metricdecl.counter(
        "healer_controller_label_refresh_failures_total",
        "node label refreshes from the scheduler that failed (the previous labels stay)",
    )
    topology_problems = metricdecl.counter(
        "healer_controller_topology_lines_rejected_total",
        "lines of controller.topology_file that could not be used (each logged, the rest kept)",
    )
    shared_cause_incidents = metricdecl.counter(
        "healer_controller_shared_cause_incidents_total",
        "shared-cause domain incidents opened (several nodes of one failure domain faulting together)",
    )
    power_draw = metricdecl.gauge(
        "healer_controller_power_draw_watts",
        "a power-budget domain's GPUs' summed power draw at the last step (controller.power_budgets)",
        ["domain"],
    )
    power_budget = metricdecl.gauge(
        "healer_controller_power_budget_watts",
        "what a power-budget domain's GPUs may draw now (the budget, or a lower demand-response shed)",
        ["domain"],
    )
    power_capped = metricdecl.gauge(
        "healer_controller_power_capped_gpus",
        "GPUs of a power-budget domain held under healer's limit now",
        ["domain"],
    )
    power_episodes = metricdecl.counter(
        "healer_controller_power_episodes_total",
        "power-budget incidents opened (a domain over its budget for its hold time, capped)",
        ["domain"],
    )
    energy_domain = metricdecl.counter(
        "healer_controller_energy_joules_total",
        "energy drawn by a failure domain's GPUs (NVML energy counters; controller.energy_accounting)",
        ["domain"],
    )
    energy_job = metricdecl.counter(
        "healer_controller_job_energy_joules_total",
        "energy drawn by a job's GPUs (NVML energy counters; controller.energy_accounting); a job not"
        " seen for an hour leaves the exposition",
        ["job"],
    )
    energy_jobs_dropped = metricdecl.counter(
        "healer_controller_energy_jobs_dropped_total",
        "GPU energy readings not counted to their job: more jobs than the energy meter's cap at once",
    )
    domain_holds = metricdecl.counter(
        "healer_controller_domain_holds_total",
        "actions held because a failure domain was at its controller.domain_limits limit",
    )
    rules_rejected = metricdecl.counter(
        "healer_controller_rules_rejected_total", "rule reloads rejected for errors"
    )
    anomaly_seconds = metricdecl.histogram(
        "healer_controller_anomaly_score_seconds",
        "CPU seconds of one batched anomaly scoring pass over the fleet",
        (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    )
    anomaly_model_loaded = metricdecl.gauge(
        "healer_controller_anomaly_model_loaded", "1 when an anomaly model is loaded and scoring"
    )
    fleet_nodes = metricdecl.gauge("healer_controller_fleet_nodes", "nodes seen by this shard")
    messages_rejected = metricdecl.counter(
        "healer_controller_messages_rejected_total",
        "frames, events and command replies not believed: identity_mismatch (the body names another"
        " node than the subject), unknown_node (not admitted), too_many_gpus (past max_gpus_per_node)",
        ["kind", "reason"],
    )
    clock_skewed = metricdecl.counter(
        "healer_controller_clock_skewed_total",
        "frames and events whose ts is further than controller.max_clock_skew_s from receive time",
        ["kind"],
    )
    invalid_fields = metricdecl.counter(
        "healer_controller_invalid_fields_total",
        "rejected frames and events by schema field out of its bounds (e.g. gpus.temp_c)",
        ["kind", "field"],
    )
    nodes_admitted = metricdecl.gauge(
        "healer_controller_nodes_admitted", "nodes admitted (controller.admission): the breaker's fleet size"
    )
    nodes_forgotten = metricdecl.counter(
        "healer_controller_nodes_forgotten_total",
        "nodes whose state was reclaimed after controller.node_retention_s of silence",
    )

    # the anomaly model's calibration per pool (docs/anomaly.md, "Shadow mode")
    anomaly_pool_live = metricdecl.gauge(
        "healer_controller_anomaly_pool_live",
        "1 when a pool's anomaly calibration is live (opens incidents), 0 in shadow",
        ["pool"],
    )
    anomaly_pool_node_days = metricdecl.gauge(
        "healer_controller_anomaly_pool_node_days", "node-days a pool's calibration has watched", ["pool"]
    )
    anomaly_pool_rate = metricdecl.gauge(
        "healer_controller_anomaly_pool_incidents_per_1000_node_days",
        "a pool's measured anomaly incidents per 1,000 node-days: live, its incidents per live node-day;"
        " in shadow, its would-be incidents per node-day watched (the budget: anomaly.false_alarm_budget)",
        ["pool"],
    )
    anomaly_pool_threshold = metricdecl.gauge(
        "healer_controller_anomaly_pool_threshold",
        "a pool's calibrated threshold per deciding component (model units; 1.0 = the model's own edge)",
        ["pool", "component"],
    )
    anomaly_shadow = metricdecl.counter(
        "healer_controller_anomaly_shadow_incidents_total",
        "would-be anomaly incidents of pools in shadow"
        " (published on the feed as io.healer.anomaly.shadow.v1)",
        ["pool"],
    )
    build_info = metricdecl.Declared(lambda r: buildinfo.register(r, "controller"))

    def __init__(self, registry: prom.CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self._start_at_zero()

    def _start_at_zero(self) -> None:
        """Every label set whose values are known up front exists from the start at 0, so a healthy
        controller's dashboard shows zeros instead of "No data" until the first error."""
        for kind in ("frame", "event"):
            for reason in codec.DECODE_REASONS:
                self.decode_errors.labels(kind, reason)
        for severity in typing.get_args(incidents.Severity):
            self.incidents_open.labels(severity).set(0)
        for kind in ("gpu", "node", "port"):  # repairs.KINDS
            self.time_between_failures.labels(kind)
        for change in incidents.Change:
            self.incident_changes.labels(change)
        for kind in actions.CATALOG:
            for status in incidents.ActionStatus:
                if status is not incidents.ActionStatus.PLANNED:
                    self.actions.labels(kind, status)
        for kind in ("frame", "event", "command_result"):
            for reason in ("identity_mismatch", "unknown_node", "too_many_gpus"):
                self.messages_rejected.labels(kind, reason)
        for kind in ("frame", "event"):
            self.clock_skewed.labels(kind)
        for task in ("lease", "leadership", "events", "ticks", "housekeeping", "feed", "repeat-count"):
            self.task_failures.labels(task)
        for connection in ("main", "telemetry"):
            self.nats_disconnects.labels(connection)
