"""Security: NATS accounts, identities and per-identity permissions (see docs/security.md)."""
