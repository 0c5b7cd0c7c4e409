"""Each node's frames in the agent's order: a repeated or late frame never moves a counter backwards.

Frames are counted in order of arrival (receive time decides, docs/architecture.md). A frame that arrives
twice, or late, carries an older cumulative counter than the one before it, and the rule engine took
that as a counter reset and counted the whole counter as an increase: a 5-minute ``rate()`` spiked (an
independently written fleet that duplicates about 0.02 % of its frames and reorders about 0.03 % opened
552 false ``rdma-port-congested`` incidents in 156 healthy node-days). The agent numbers its frames
(``seq``, per boot) and names its boot (``boot_id``, new at every start), so each node's pair decides:
a frame of the node's current boot with a ``seq`` at or below the newest seen is a duplicate or late and
is dropped (counted, logged at a bounded rate); a frame of a boot already replaced is late too; a new
boot starts afresh, and the engine resets its counters then, as before.

No I/O, no clock: ``Ingest.on_frame`` asks ``verdict`` once per admitted frame.
"""

from __future__ import annotations

import enum

RETIRED_BOOTS = 4
"""Boots per node remembered as replaced: a frame of one of them arriving late is dropped."""


class Verdict(enum.StrEnum):
    """What a frame is to its node's order (the metric's ``reason`` label, except ``FRESH``)."""

    FRESH = "fresh"
    DUPLICATE = "duplicate"
    """Its boot's ``seq`` was seen already (a redelivery, a resend after an outage)."""
    LATE = "late"
    """Older than the newest frame of its boot (a reorder, or a repeat of an older frame)."""
    OLD_BOOT = "old_boot"
    """Of a boot the node has since replaced (the agent restarted; this one arrived after)."""


STALE = (Verdict.DUPLICATE, Verdict.LATE, Verdict.OLD_BOOT)

# The members as module constants for the per-frame path: on Python 3.11 reading a member off its enum
# class (``Verdict.FRESH``) costs ~0.35 us (EnumType's ``__getattr__`` routes every class attribute read
# through a Python-level hook), two a frame were ~2 % of the controller's ingest (#40 item 7).
FRESH, DUPLICATE, LATE, OLD_BOOT = Verdict.FRESH, Verdict.DUPLICATE, Verdict.LATE, Verdict.OLD_BOOT


class FrameOrder:
    """Per node: its current boot, the newest ``seq`` of that boot, and the boots it replaced."""

    def __init__(self) -> None:
        self._newest: dict[str, tuple[str, int]] = {}
        self._retired: dict[str, tuple[str, ...]] = {}

    def verdict(self, node: str, boot_id: str, seq: int) -> Verdict:
        """Judge a frame and, when it is fresh, remember it as the node's newest."""
        current = self._newest.get(node)
        if current is not None:
            boot, newest = current
            if boot == boot_id:
                if seq <= newest:
                    return DUPLICATE if seq == newest else LATE
            elif boot_id in self._retired.get(node, ()):
                return OLD_BOOT
            else:
                self._retired[node] = (boot, *self._retired.get(node, ()))[:RETIRED_BOOTS]
        self._newest[node] = (boot_id, seq)
        return FRESH

    def forget(self, node: str) -> None:
        """A node forgotten for silence starts afresh when it reports again."""
        self._newest.pop(node, None)
        self._retired.pop(node, None)

    def __len__(self) -> int:
        return len(self._newest)
