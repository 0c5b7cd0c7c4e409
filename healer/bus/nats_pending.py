"""nats-py's per-subscription queue made fair by source (healer/bus/fair.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from healer.bus import base, fair

if TYPE_CHECKING:
    from healer.bus.nats import NatsBus

log = structlog.get_logger(__name__)

MSG_OVERHEAD_BYTES = 512
"""What one queued message costs beside its payload (nats-py's Msg object, its subject string): what a
fair backlog counts against its ``max_bytes``, so a flood of tiny messages cannot fill memory."""


class FairPending(asyncio.Queue):  # type: ignore[type-arg]
    """nats-py's per-subscription queue, made fair by source (healer/bus/fair.py).

    nats-py puts each message it reads off the socket into ``Subscription._pending_queue``
    (``put_nowait``) and the subscription's task takes them (``get``) for the callback. This queue
    screens each message as it is put (``Fairness.source``: None drops it before it queues), keeps it
    under its source, sheds a source's oldest past ``per_source`` (counted in ``bus.dropped``) and
    gives them out round-robin, so a flooding subject never fills the queue for the others and the
    flood's backlog is gone as soon as it stops. It relies on asyncio.Queue's ``_init``/``_put``/``_get``
    hooks (as ``PriorityQueue`` does) and on nats-py 2.x keeping the queue in ``_pending_queue``; where
    that attribute is missing the subscription stays first-in first-out, logged once."""

    def __init__(self, fair: base.Fairness, on_shed: Callable[[], None]) -> None:
        self._fair_spec = fair
        self._on_shed = on_shed
        super().__init__(maxsize=0)

    def _init(self, maxsize: int) -> None:
        self._queue: fair.FairQueue[Any] = fair.FairQueue(
            self._fair_spec.per_source, self._fair_spec.max_bytes,
            size=lambda m: len(m.data) + MSG_OVERHEAD_BYTES,
        )  # fmt: skip
        vet = self._fair_spec.vet
        self._admit: Callable[[Any], bool] | None = None if vet is None else lambda m: vet(m.subject, m.data)
        """The vet, asked by the fair queue only when the message's source is full."""

    def _put(self, item: Any) -> None:
        # put_nowait counts one more unfinished task after this; one that is not kept must not count.
        source = self._fair_spec.source(item.subject, item.data)
        if source is None:
            self._unfinished_tasks -= 1  # type: ignore[attr-defined]
            return
        shed = self._queue.put(source, item, self._admit)
        if shed is not None:
            self._unfinished_tasks -= 1  # type: ignore[attr-defined]
            if shed is not fair.VETTED:  # refused by the vet, which tallied it: not a shed
                self._on_shed()

    def _get(self) -> Any:
        got = self._queue.pop()
        assert got is not None  # asyncio.Queue only calls _get when not empty
        return got[1]

    def take(self, most: int) -> list[Any]:
        """Up to ``most`` messages at once, in ``get``'s order (the queue is unbounded: no putter ever
        waits to be woken); each is ``task_done`` once handled, as a message from ``get`` is."""
        out: list[Any] = []
        pop = self._queue.pop
        while len(out) < most and (got := pop()) is not None:
            out.append(got[1])
        return out

    @classmethod
    def install(
        cls, sub: Any, fair: base.Fairness, bus: NatsBus, batches: Callable[[FairPending], Any] | None = None
    ) -> bool:
        """Swap the subscription's queue for a fair one; its messages are then taken by a fresh nats-py
        task (one callback per message), or by ``batches(queue)``'s coroutine, run as the subscription's
        task (nats-py cancels it on unsubscribe and waits on the queue when draining, as its own).
        False, logged, where nats-py's internals are not what this expects (nothing swapped)."""
        old = getattr(sub, "_pending_queue", None)
        task = getattr(sub, "_wait_for_msgs_task", None)
        if not isinstance(old, asyncio.Queue) or task is None or not hasattr(sub, "_start"):
            log.warning("nats.fair_backlog_unavailable", subject=getattr(sub, "subject", "?"))
            return False
        sid = sub._id

        def shed() -> None:
            bus.dropped[sid] += 1

        queue = cls(fair, shed)
        while not old.empty():  # what arrived before the swap (nothing awaits between these lines)
            queue.put_nowait(old.get_nowait())
        sub._pending_queue = queue
        task.cancel()  # it may be waiting on the old queue: a fresh one waits on this one
        if batches is None:
            sub._start(bus.nc._error_cb)
        else:
            sub._wait_for_msgs_task = asyncio.get_running_loop().create_task(
                batches(queue), name=f"nats-batches:{sub.subject}"
            )
        return True
