"""The read-only status page (``healer ui``): the fleet map, open incidents with their timelines, the
breaker and exclusions, the recent feed, live over server-sent events. docs/ui.md describes it.

``fleet`` (telemetry picture) and ``board`` (the controller's decisions) are pure state; ``live`` turns
them into messages for browsers; ``sources`` feeds them from NATS; ``server`` serves the page.
"""
