"""The controller: telemetry in, decisions out, every decision on the durable incident feed.

Sub-packages by pipeline stage, each importing only those listed before it (tests/test_imports.py):

- ``observability``: the controller's metrics and its rate-bounded log lines, JetStream storage's watch;
- ``store``: JSON documents in KV with compare-and-set, the leader lease, whether this controller leads;
- ``inventory``: which nodes are admitted, their failure domains and the limit per domain, which jobs run
  where;
- ``power``: the power budget's pure step and the energy meter;
- ``incidents``: the incident book, the pure decisions (correlation, node-wide faults, gates),
  shared-cause domains, closing by hand, the feed publisher;
- ``failslow``: step times, stragglers and slow ports, job slowdowns as incidents;
- ``remediation``: the action runner, the safety policy (breaker, exclusions), the recovery ladders;
- ``core``: the service and its loop (leadership, ingest, tick, reload, readiness, housekeeping, the
  anomaly model) and the shells that carry the stages' decisions out (incidents, power budgets).

Evaluation and bench harnesses are not here: they live in ``healer.evals``.
"""
