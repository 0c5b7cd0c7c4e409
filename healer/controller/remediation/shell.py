"""What the action runner and the recovery ladders ask of the controller around them: one small Protocol.

``runner.ActionRunner`` and ``healing.Recovery`` receive a ``Shell`` instead of loose callbacks, so what
passes between the rooms is written down in one place and checked by mypy. The controller's
``incident_shell.IncidentShell`` is the one real implementation.
"""

from __future__ import annotations

from typing import Protocol

from healer.controller.incidents import book
from healer.controller.inventory import blast
from healer.schemas import incidents


class Shell(Protocol):
    @property
    def leader(self) -> bool:
        """Acting as leader now (took over, lease renewed within half its TTL); asked before each step."""
        ...

    def fleet_size(self) -> int:
        """The circuit breaker's denominator: the admitted nodes (all shards')."""
        ...

    def domains(self, node: str) -> blast.View:
        """``node``'s failure domains that have a ``domain_limits`` limit, with their members."""
        ...

    async def publish(self, inc: book.Incident, change: incidents.Change) -> None:
        """Save one change of ``inc`` to the incident book and put it on the feed."""
        ...

    def spawn(self, inc: book.Incident) -> None:
        """Run the incident's pending actions in its own task, after any task it already has."""
        ...

    async def reboots(self, node: str) -> int:
        """How many other nodes are rebooting now (recovery ladders); asked before a ``reboot_node``."""
        ...
