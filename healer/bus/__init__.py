"""Talking to NATS: subject names, the embedded server, the real and in-memory buses, provisioning."""
