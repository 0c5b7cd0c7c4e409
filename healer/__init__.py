"""healer: an event-driven self-healing agent for GPU datacenters.

Layers, bottom to top (lower layers never import higher ones):
``schemas``, ``errors``, ``config`` → ``telemetry``, ``bus`` → ``agent`` → ``cli``.
"""

__version__ = "0.1.0"
