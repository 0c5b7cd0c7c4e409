"""Can this identity do what a node agent does on NATS? A probe for ``healer doctor``, without side effects.

Three questions, asked with the node's own settings (URL, seed or creds file, inbox prefix, TLS):

- **Connect**: does the server accept these credentials?
- **Publish**: is the node allowed to publish on its own events subject, and refused on another node's?
  Each probe message carries ``Nats-Expected-Stream: <a stream that never exists>``, so JetStream, which
  captures the events subjects, answers it with an error and stores nothing. An allowed publish is
  proven by that answer (or by "no responders" where no stream is provisioned yet); a refused one by the
  server's ``Permissions Violation`` for that subject, which arrives before the answer to the PING that
  ``flush`` sends (so no wait on a timer decides it). A refused probe reaches nobody; an allowed one to
  another node's subject (the defect being looked for) is refused by JetStream and stored nowhere.
- **Clock**: the server's ``/varz`` ``now`` (the monitoring port, where reachable) against the local
  clock, half the round trip being the error bound. Where the monitoring port is out of reach (it
  listens on loopback in deploy/nats), the newest leader lease's stored time bounds it: the server
  stamped that message at most ``lease_ttl_s`` ago (the leader renews well within its TTL), so the
  offset lies in ``[now - stamp - ttl, now - stamp]``; a node may read that one message
  (``$JS.API.STREAM.MSG.GET`` on the leases stream) and nothing else of JetStream.

Only this package imports nats-py; what the probe found is a ``PublishProbe`` / ``ClockProbe``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any, Final

import nats.aio.client
import nats.errors

from healer import config, errors
from healer.bus import nats as natsbus
from healer.bus import nats_errors

PROBE_STREAM: Final = "HEALER_DOCTOR_PROBE_NEVER_A_STREAM"
"""The stream name no one creates: JetStream refuses a message that expects it, and stores nothing."""
PROBE_HEADERS: Final = {"Nats-Expected-Stream": PROBE_STREAM}


@dataclasses.dataclass(frozen=True, slots=True)
class PublishProbe:
    subject: str
    allowed: bool
    detail: str


@dataclasses.dataclass(frozen=True, slots=True)
class ClockProbe:
    offset_s: float
    """Local clock minus the server's (positive: this node runs ahead)."""
    error_s: float
    """Half the round trip: the offset is right to within this."""


@dataclasses.dataclass(frozen=True, slots=True)
class ClockBound:
    """The local clock minus the server's lies in ``[low_s, high_s]``."""

    low_s: float
    high_s: float
    stamped_at: float


async def lease_clock(
    nc: Any, api_subject: str, lease_subject: str, ttl_s: float, timeout_s: float,
    clock: Callable[[], float] = time.time,
) -> ClockBound | None:  # fmt: skip
    """Bound the offset by the newest lease message's server time; None where there is no lease."""
    request = json.dumps({"last_by_subj": lease_subject}).encode()
    try:
        reply = await nc.request(api_subject, request, timeout=timeout_s)
        body = json.loads(reply.data)
    except (TimeoutError, nats.errors.Error, ValueError):
        return None
    now = clock()
    stamp = body.get("message", {}).get("time") if isinstance(body, dict) else None
    if not stamp:
        return None
    at = parse_time(str(stamp))
    return ClockBound(low_s=now - at - ttl_s, high_s=now - at, stamped_at=at)


async def connect(url: str, ns: config.NatsSettings, name: str) -> tuple[Any, list[str]]:
    """A bare nats-py client with ``ns``'s credentials and TLS, and the list its permission errors go to."""
    denied: list[str] = []

    async def on_error(e: Exception) -> None:
        if "permissions violation" in str(e).lower():
            denied.append(str(e))

    options: dict[str, Any] = {
        "servers": [u.strip() for u in url.split(",")],
        "name": name,
        "connect_timeout": ns.connect_timeout_s,
        "allow_reconnect": False,
        "max_reconnect_attempts": 0,
        "error_cb": on_error,
    }
    if ns.creds_file:
        options["user_credentials"] = ns.creds_file
    if ns.nkey_seed_file:
        options["nkeys_seed"] = ns.nkey_seed_file
    if ns.inbox_prefix:
        options["inbox_prefix"] = ns.inbox_prefix
    tls = natsbus._tls_context(ns)
    if tls is not None:
        options["tls"] = tls
    nc = nats.aio.client.Client()
    try:
        await nc.connect(**options)
    except (OSError, TimeoutError, nats.errors.Error) as e:
        with contextlib.suppress(Exception):
            await nc.close()
        raise errors.PermanentError(f"cannot connect to NATS at {url}: {nats_errors.describe(e)}") from e
    return nc, denied


async def publish_allowed(nc: Any, denied: list[str], subject: str, timeout_s: float) -> PublishProbe:
    """Ask JetStream about a message that expects a stream which does not exist (see the module doc).
    The refusal, if any, is known once the flush returns; only an allowed probe waits for its answer."""
    before = len(denied)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, max_msgs=1)
    try:
        await nc.publish(subject, b"", reply=inbox, headers=PROBE_HEADERS)
        await _flush(nc, timeout_s)
        if _names(denied[before:], subject):
            return PublishProbe(subject, False, "refused by the server (Permissions Violation)")
        try:
            reply = await sub.next_msg(timeout=timeout_s)
        except (TimeoutError, nats.errors.TimeoutError):
            return PublishProbe(subject, True, "allowed (no refusal; no answer within the timeout)")
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    if (reply.headers or {}).get("Status") == "503":
        return PublishProbe(subject, True, "allowed (no stream captures it yet: nothing stored)")
    body = reply.data.decode(errors="replace")
    return PublishProbe(subject, True, f"allowed (JetStream refused the probe, stored nothing: {body[:120]})")


async def publish_refused(nc: Any, denied: list[str], subject: str, timeout_s: float) -> PublishProbe:
    """Publish the probe to a subject this identity must not have; the server's refusal is the answer."""
    before = len(denied)
    await nc.publish(subject, b"", headers=PROBE_HEADERS)
    await _flush(nc, timeout_s)
    if _names(denied[before:], subject):
        return PublishProbe(subject, False, "refused by the server (Permissions Violation)")
    return PublishProbe(subject, True, "ALLOWED: this identity may publish as another node")


async def _flush(nc: Any, timeout_s: float) -> None:
    # twice: nats-py may still hold the earlier publish in its buffer when the first PING goes out
    for _ in range(2):
        await nc.flush(timeout=max(1, round(timeout_s)))


def _names(messages: list[str], subject: str) -> bool:
    return any(f'"{subject}"' in m or f" {subject}" in m for m in messages)


def server_clock(
    monitor_url: str, *, clock: Callable[[], float] = time.time, timeout_s: float = 3.0
) -> ClockProbe:
    """Offset of the local clock against ``<monitor_url>/varz``'s ``now``."""
    url = monitor_url.rstrip("/") + "/varz"
    sent = clock()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            body = json.loads(r.read())
    except (OSError, ValueError) as e:
        raise errors.TemporaryError(f"cannot read {url}: {e}") from e
    got = clock()
    server = parse_time(str(body.get("now", "")))
    return ClockProbe(offset_s=(sent + got) / 2 - server, error_s=(got - sent) / 2)


def parse_time(text: str) -> float:
    """RFC 3339 with up to nanoseconds (Go's ``time.Time``), as unix seconds."""
    head, dot, rest = text.partition(".")
    frac, zone = "", rest
    if dot:
        i = next((k for k, ch in enumerate(rest) if not ch.isdigit()), len(rest))
        frac, zone = rest[:i], rest[i:]
    else:
        for sep in ("Z", "+", "-"):
            idx = head.rfind(sep)
            if idx > 10:
                head, zone = head[:idx], head[idx:]
                break
    zone = "+00:00" if zone in ("Z", "") else zone
    try:
        whole = datetime.datetime.fromisoformat(head + zone).timestamp()
    except ValueError as e:
        raise errors.PermanentError(f"not a server time: {text!r}") from e
    return whole + (float("0." + frac) if frac else 0.0)
