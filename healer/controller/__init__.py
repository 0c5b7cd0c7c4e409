"""The controller: telemetry in, decisions out, every decision on the durable incident feed."""
