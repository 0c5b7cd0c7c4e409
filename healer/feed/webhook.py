"""One HTTP POST of one CloudEvent, with the answer sorted into healer's error vocabulary.

Standard library only (``urllib`` in a worker thread): 2xx is delivered; a connection error, a timeout,
408, 429 and 5xx are ``errors.TemporaryError`` (worth retrying, after ``Retry-After`` if the receiver
sent one); every other answer, including a redirect (a webhook that moved is a configuration error to
fix, not something to follow with a POST), is a ``Refused``: retrying the same event will not help.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import http.client
import time
import urllib.error
import urllib.request
from collections.abc import Mapping

import healer
from healer import errors

CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"
RETRYABLE_STATUS = frozenset({408, 429})
BODY_EXCERPT_BYTES = 512


class Refused(errors.PermanentError):
    """The receiver answered, and the answer means this event will never be accepted as it is."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"receiver refused the event: HTTP {status}: {body[:200]}")
        self.status = status
        self.body = body


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


@dataclasses.dataclass(frozen=True)
class Delivery:
    status: int
    elapsed_s: float


def headers_for(event_id: str, event_type: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Structured mode: the body is the whole event; ``ce-id``/``ce-type`` let receivers dedup cheaply."""
    return {
        "Content-Type": CONTENT_TYPE,
        "ce-id": event_id,
        "ce-type": event_type,
        "User-Agent": f"healer-forward/{healer.__version__}",
        **(extra or {}),
    }


def retry_after_s(value: str | None, now: float | None = None) -> float:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date); 0 if absent or bad."""
    if not value:
        return 0.0
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return 0.0
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


def post_sync(url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> Delivery:
    start = time.monotonic()
    req = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            resp.read()
            return Delivery(status=int(resp.status), elapsed_s=time.monotonic() - start)
    except urllib.error.HTTPError as e:
        status = int(e.code)
        try:
            text = e.read(BODY_EXCERPT_BYTES).decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            text = ""
        finally:
            e.close()
        if status >= 500 or status in RETRYABLE_STATUS:
            raise errors.TemporaryError(
                f"receiver answered HTTP {status}", delay=retry_after_s(e.headers.get("Retry-After"))
            ) from e
        raise Refused(status, text) from e
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        raise errors.TemporaryError(f"receiver unreachable: {e!r}", delay=0.0) from e


async def post(url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> Delivery:
    """POST in a worker thread, so a slow receiver never blocks the event loop."""
    return await asyncio.to_thread(post_sync, url, body, headers, timeout_s)
