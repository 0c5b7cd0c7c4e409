"""nats-py's failures in healer's vocabulary: what "try again" means is decided here, once."""

from __future__ import annotations

import asyncio

import nats
import nats.errors
import nats.js.errors

from healer import errors

TEMPORARY = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,
    asyncio.TimeoutError,
    ConnectionError,
)


def is_temporary(e: BaseException) -> bool:
    """Whether a nats-py error means "try again": a server away or reconnecting, a timeout, no
    responders, a stream or consumer without a leader (an election in progress: 503, no stream
    response), or any other JetStream API error with a 5xx code. One definition for every caller (KV,
    streams, consumers), so losing one server of three is never a permanent failure anywhere."""
    if isinstance(e, TEMPORARY):
        return True
    return isinstance(e, nats.js.errors.APIError) and e.code is not None and int(e.code) >= 500


FAILURES = (nats.errors.Error, OSError, TimeoutError)


NO_STORAGE = 10023
"""JetStream err_code "insufficient resources": a write refused because the store (or the account's
storage) is full."""


def describe(e: BaseException) -> str:
    """A nats-py failure in one line that says why: JetStream's own code and description (nats-py's
    ``repr`` of an API error is only ``ServiceUnavailableError()``), and for a full store what to do."""
    if isinstance(e, nats.js.errors.APIError):
        if e.err_code == NO_STORAGE:
            return (
                "JetStream refused the write: its store is full (insufficient resources, err 10023); "
                "a stream without a byte limit filled it: see `healer nats status`, run `healer nats "
                "provision` (docs/operations.md)"
            )
        return f"JetStream {type(e).__name__} {e.code}/{e.err_code}: {e.description or 'no description'}"
    return repr(e)


def translate(what: str, e: BaseException) -> errors.HealerError:
    """A nats-py failure as healer's: what "try again" means is decided once, in ``is_temporary``;
    anything else is permanent."""
    if is_temporary(e):
        return errors.TemporaryError(f"{what}: {describe(e)}")
    return errors.PermanentError(f"{what}: {describe(e)}")
