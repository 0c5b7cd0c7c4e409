"""Blast radius per failure domain (#27): at most N nodes, or P %, of any one rack, switch or NVLink
domain out of service at once, beside the fleet-wide breaker.

``controller.domain_limits`` sets a limit per domain key (``{rack: {max_nodes: 2}, switch:
{max_percent: 25}}``). What counts is the same as the breaker's: the nodes healer took out of service
in ``breaker_window_s``, the entries of the breaker's KV document (so every shard, a restarted
controller and a standby that takes over count the same nodes; there is no second document to lose).
A node may be taken out only while each of its limited domains stays within its limit with it.

Unlike the breaker, a domain at its limit opens nothing: the action waits (``domain_hold`` returns the
``Hold``, which names the domain and the limit for the incident) and every other domain, and the rest of
the fleet, keeps healing. Pure: the shell gathers the node's ``View`` from the topology and the breaker
document; ``gates.breaker_admission`` calls ``domain_hold`` inside the breaker's compare-and-set loop.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

from healer import config
from healer.controller.inventory import topology


@dataclasses.dataclass(frozen=True, slots=True)
class View:
    """One node's limited domains: ``(key, value) -> members`` (the node among them)."""

    members: Mapping[tuple[str, str], frozenset[str]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, believed: topology.Topology, node: str, limits: Mapping[str, config.DomainLimit]) -> View:
        domains = believed.of(node)
        return cls(
            {
                (key, domains[key]): believed.members(key, domains[key]) | {node}
                for key in sorted(limits)
                if key in domains
            }
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Hold:
    """A domain at its limit: taking one more of its nodes out would exceed it."""

    key: str
    value: str
    limit: int
    size: int
    counted: tuple[str, ...]
    """The domain's nodes already out (in the breaker's window)."""
    setting: str
    """The limit as configured, e.g. ``max_nodes=2`` or ``max_percent=25``."""

    @property
    def domain(self) -> str:
        return f"{self.key}={self.value}"

    @property
    def reason(self) -> str:
        return (
            f"domain limit: {self.domain} has {len(self.counted)} of {self.size} nodes out "
            f"({', '.join(self.counted)[:400]}), limit {self.limit} ({self.key}: {self.setting})"
        )


def limit_of(size: int, limit: config.DomainLimit) -> int:
    """The number of a domain's ``size`` nodes that may be out: the stricter of the two, never below one."""
    caps = [limit.max_nodes] if limit.max_nodes is not None else []
    if limit.max_percent is not None:
        caps.append(math.floor(size * limit.max_percent / 100.0))
    return max(1, min(caps)) if caps else size


def _setting(limit: config.DomainLimit) -> str:
    parts = []
    if limit.max_nodes is not None:
        parts.append(f"max_nodes={limit.max_nodes}")
    if limit.max_percent is not None:
        parts.append(f"max_percent={limit.max_percent:g}")
    return ", ".join(parts) or "none"


def domain_hold(
    out: Iterable[str], node: str, view: View, limits: Mapping[str, config.DomainLimit]
) -> Hold | None:
    """The first of ``node``'s domains (by key) that one more node out would push past its limit, or
    None. ``out``: the nodes healer has out of service now (the breaker's window)."""
    already = set(out)
    for (key, value), members in sorted(view.members.items()):
        limit = limits.get(key)
        if limit is None:
            continue
        counted = tuple(sorted(already & members - {node}))
        allowed = limit_of(len(members), limit)
        if len(counted) + 1 > allowed:
            return Hold(key, value, allowed, len(members), counted, _setting(limit))
    return None
