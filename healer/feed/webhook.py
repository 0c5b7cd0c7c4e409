"""One HTTP POST of one CloudEvent, with the answer sorted into healer's error vocabulary.

The event goes out in either content mode of the CloudEvents HTTP binding: **structured** (default; the
body is the event exactly as stored, ``Content-Type: application/cloudevents+json``, and no ``ce-``
header, since any ``ce-`` header tells a receiver such as the official SDK's ``from_http`` that the
message is in binary mode) or **binary** (every context attribute, extensions included, as a
percent-encoded ``ce-<name>`` header, ``Content-Type`` = ``datacontenttype``, the body = ``data``).

Standard library only (``urllib`` in a worker thread): 2xx is delivered; a connection error, a timeout,
408, 429 and 5xx are ``errors.TemporaryError`` (worth retrying, after ``Retry-After`` if the receiver
sent one); every other answer, including a redirect (a webhook that moved is a configuration error to
fix, not something to follow with a POST), is a ``Refused``: retrying the same event will not help.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import email.utils
import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Literal

import orjson

import healer
from healer import errors

CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"
ContentMode = Literal["structured", "binary"]
CONTENT_MODES: tuple[ContentMode, ...] = ("structured", "binary")
_HEADER_SAFE = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in ' "%')
"""Printable ASCII but space, ``"`` and ``%``: left as is in a ``ce-`` header (HTTP binding 3.1.3.2)."""
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


@dataclasses.dataclass(frozen=True)
class Message:
    """An HTTP request body and the headers that go with it."""

    headers: dict[str, str]
    body: bytes


def message(raw: bytes, mode: ContentMode = "structured", extra: Mapping[str, str] | None = None) -> Message:
    """The HTTP message for one stored CloudEvent (JSON format) in the given content mode.

    ``raw`` must already have passed ``envelope.classify``; attribute values are taken as stored."""
    base = {"User-Agent": f"healer-forward/{healer.__version__}"}
    if mode == "structured":
        return Message({"Content-Type": CONTENT_TYPE, **base, **(extra or {})}, raw)
    doc = orjson.loads(raw)
    headers: dict[str, str] = {}
    for name, value in doc.items():
        if name in ("data", "data_base64", "datacontenttype") or value is None:
            continue
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        headers[f"ce-{name}"] = urllib.parse.quote(text, safe=_HEADER_SAFE)
    if "data_base64" in doc:
        body = base64.b64decode(doc["data_base64"])
    elif "data" in doc:
        body = orjson.dumps(doc["data"])
    else:
        body = b""
    if body or "datacontenttype" in doc:
        headers["Content-Type"] = str(doc.get("datacontenttype") or "application/json")
    return Message({**headers, **base, **(extra or {})}, body)


def event_json(headers: Mapping[str, str], body: bytes) -> bytes:
    """The CloudEvent in an HTTP message of either content mode, as JSON bytes for ``envelope.classify``.

    The inverse of ``message``: with any ``ce-`` header the message is binary mode (attributes from the
    headers, ``datacontenttype`` from ``Content-Type``, ``data`` from the body); otherwise the body is
    the event. Raises ``errors.DecodeError`` when the data of a JSON content type is not JSON."""
    lower = {name.lower(): value for name, value in headers.items()}
    if not any(name.startswith("ce-") for name in lower):
        return body
    doc: dict[str, object] = {
        name[3:]: urllib.parse.unquote(value) for name, value in lower.items() if name.startswith("ce-")
    }
    content_type = lower.get("content-type")
    if content_type is not None:
        doc["datacontenttype"] = content_type
    media = (content_type or "application/json").split(";", 1)[0].strip().lower()
    if body and (media == "application/json" or media.endswith("+json")):
        try:
            doc["data"] = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise errors.DecodeError("cloudevent", "json", f"binary-mode data: {e}") from None
    elif body:
        doc["data_base64"] = base64.b64encode(body).decode()
    return orjson.dumps(doc)


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
