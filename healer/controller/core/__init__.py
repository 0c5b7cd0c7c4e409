"""The controller's service and its loop: leadership, ingest, the tick, rule reloads, readiness, housekeeping
and the anomaly model; and the shells that carry each stage's decisions out against KV, the bus and the
runner (the incident shell; the power shell, what it shows and its bus API).
"""
