"""Incidents: the book in KV, the pure decisions over it (incident changes, correlation, node-wide faults,
the gates), shared-cause domain incidents, incidents a person closes, and the feed that publishes every
change.
"""
