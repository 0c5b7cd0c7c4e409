"""The node agent: samples a TelemetrySource, streams frames and events to NATS, executes commands."""
