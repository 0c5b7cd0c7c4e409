"""The first connection to NATS, and what one connection's callbacks do for its whole life.

tenacity owns the first connect (bounded by ``retry.attempts``, each retry logged with what the server
said); once connected, nats-py reconnects by itself forever and ``Callbacks`` reports each disconnect,
reconnect and error once, in healer's log vocabulary.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import TYPE_CHECKING, Any

import nats.errors
import structlog
import tenacity
from nats.aio.client import Client

from healer import config, errors

if TYPE_CHECKING:
    from healer.bus.nats import NatsBus

log = structlog.get_logger(__name__)


class Callbacks:
    """nats-py's disconnected, reconnected and error callbacks for one connection. ``bus`` is None until
    the first connect succeeds; what nats-py reports before that is kept in ``first_contact``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.bus: NatsBus | None = None
        self.last_error: list[Exception] = []
        """The error that ended the connection (nats-py reports it just before the disconnect)."""
        self.attempts = 0
        self.refused: list[BaseException] = []
        self.refused_event = asyncio.Event()
        self.first_contact: list[Exception] = []
        """What nats-py reported while not yet connected (its NoServersError alone says nothing)."""

    async def on_disconnect(self) -> None:
        bus = self.bus
        if bus is not None and bus._closing:
            log.info("nats.closed", name=self.name)  # a clean exit is no warning
            return
        self.attempts = 0
        last = self.last_error
        log.warning("nats.disconnected", name=self.name, error=repr(last[-1]) if last else None)
        last.clear()
        if bus is not None:
            bus.disconnects += 1

    async def on_reconnect(self) -> None:
        self.attempts = 0
        log.info("nats.reconnected", name=self.name, server=str(getattr(self.bus, "server", "")))
        if self.bus is not None:
            for cb in self.bus.on_reconnect:
                await cb()

    async def on_error(self, e: Exception) -> None:
        bus, name = self.bus, self.name
        if bus is None:
            self.first_contact.append(e)
        if isinstance(e, ssl.SSLCertVerificationError) and bus is None:
            # The server's certificate does not verify against our CA: a setting to fix, not a
            # network blip (and nats-py can hang after it instead of giving up).
            self.refused.append(e)
            self.refused_event.set()
            return
        if isinstance(e, nats.errors.SlowConsumerError) and bus is not None:
            bus._slow_consumer(e, name)
            return
        if "permissions violation" in str(e).lower():
            # Not transient: this identity tried something its credentials do not allow.
            log.error("nats.permission_denied", name=name, error=str(e))
            return
        if bus is not None and bus._closing:
            log.debug("nats.error_while_closing", name=name, error=repr(e))
        elif bus is not None and bus.nc.is_reconnecting:
            # one line per reconnection attempt (nats-py calls back once per failed attempt)
            self.attempts += 1
            log.warning("nats.reconnect_failed", name=name, attempt=self.attempts, error=repr(e))
        elif bus is not None and isinstance(e, OSError | nats.errors.UnexpectedEOF):
            self.last_error.append(e)  # the connection is ending: said once, by nats.disconnected
        else:
            log.warning("nats.error", name=name, error=repr(e))


def options(
    url: str, name: str, ns: config.NatsSettings, callbacks: Callbacks, tls: ssl.SSLContext | None
) -> dict[str, Any]:
    """nats-py's connect options from the settings."""
    opts: dict[str, Any] = {
        "servers": [u.strip() for u in url.split(",") if u.strip()],
        "name": name,
        "connect_timeout": ns.connect_timeout_s,
        "reconnect_time_wait": ns.reconnect_wait_s,
        # nats-py retries a failed *first* connect forever unless attempts are bounded, which would
        # hide a wrong URL; tenacity owns the first connect (bounded, logged), nats-py the rest:
        # once connected, the bus switches reconnecting to "forever".
        "max_reconnect_attempts": 1,
        "allow_reconnect": True,
        "disconnected_cb": callbacks.on_disconnect,
        "reconnected_cb": callbacks.on_reconnect,
        "error_cb": callbacks.on_error,
    }
    if ns.creds_file:
        opts["user_credentials"] = ns.creds_file
    if ns.nkey_seed_file:
        opts["nkeys_seed"] = ns.nkey_seed_file
    if ns.inbox_prefix:
        opts["inbox_prefix"] = ns.inbox_prefix
    if tls is not None:
        opts["tls"] = tls
    return opts


def _retrying(url: str, name: str, rs: config.RetrySettings, callbacks: Callbacks) -> tenacity.AsyncRetrying:
    first_contact = callbacks.first_contact
    return tenacity.AsyncRetrying(
        retry=tenacity.retry_if_exception_type((OSError, nats.errors.Error, asyncio.TimeoutError)),
        wait=tenacity.wait_exponential(multiplier=rs.initial_delay_s, max=rs.max_delay_s),
        stop=tenacity.stop_after_attempt(rs.attempts) if rs.attempts else tenacity.stop_never,
        before_sleep=lambda state: log.warning(
            "nats.connect_retry",
            name=name,
            url=url,
            attempt=state.attempt_number,
            error=repr(first_contact[-1] if first_contact else state.outcome.exception())
            if state.outcome
            else None,
            delay_s=round(state.next_action.sleep, 3) if state.next_action else None,
        ),
        reraise=True,
    )


async def _attempt_once(url: str, opts: dict[str, Any], callbacks: Callbacks) -> Client:
    """One connect, given up at once when the server's certificate is refused."""
    nc = Client()
    connecting = asyncio.create_task(nc.connect(**opts))
    refusal = asyncio.create_task(callbacks.refused_event.wait())
    try:
        await asyncio.wait({connecting, refusal}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        refusal.cancel()
    if connecting.done():
        await connecting  # raises what the attempt raised
        return nc
    connecting.cancel()
    await asyncio.wait({connecting}, timeout=2.0)
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(nc.close(), 2.0)
    raise errors.PermanentError(
        f"NATS at {url}: TLS certificate verification failed ({callbacks.refused[0]}); check "
        "nats.tls_ca_file (the CA that signed the server's certificate)"
    )


async def first_connect(
    url: str,
    name: str,
    ns: config.NatsSettings,
    rs: config.RetrySettings,
    callbacks: Callbacks,
    tls: ssl.SSLContext | None,
) -> Client:
    """A connected nats-py client, after as many attempts as ``rs`` allows (``TemporaryError`` when
    they are spent, naming what the server said; ``PermanentError`` for a refused certificate)."""
    opts = options(url, name, ns, callbacks, tls)
    try:
        async for attempt in _retrying(url, name, rs, callbacks):
            with attempt:
                nc = await _attempt_once(url, opts, callbacks)
    except (TimeoutError, OSError, nats.errors.Error) as e:
        # The server's refusal says most, even when a later attempt only timed out (a loaded machine)
        first_contact = callbacks.first_contact
        told = [f for f in first_contact if "authorization" in str(f).lower()] or first_contact
        why = told[-1] if told else e
        raise errors.TemporaryError(f"cannot connect to NATS at {url}: {why!r}") from e
    return nc
