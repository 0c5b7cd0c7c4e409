"""The status page's one write: an operator's verdict on an incident (``POST /api/verdict``), the same
``io.healer.incident.verdict.v1`` event ``healer incidents verdict`` publishes (healer.feed.operator).

Only behind a token (``ui.token``): a page without one answers 403, because anybody who reaches it (on
loopback: any local process, or a web page in a browser there) could post verdicts as anyone. The token
check is the page's own (``server``'s guard, before this handler); the body must be JSON
(``Content-Type: application/json``), which a cross-site form cannot send, and the cookie is
``SameSite=Strict``. ``GET /api/verdicts`` tells the page whether the buttons are there, and why not.

A refused request is answered with one line saying why (400, 403, 413, 415), logged and counted
(``live.stats["verdicts_refused"]``); a bus that cannot publish is a 503. Nothing is retried for the
person: they press again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import orjson
import pydantic
import structlog
from aiohttp import web

from healer import config, errors
from healer.bus import base, subjects
from healer.feed import operator
from healer.schemas import verdicts
from healer.ui import live

log = structlog.get_logger(__name__)

PATH: Final = "/api/verdict"
"""The one path the page answers a POST on."""
MAX_BODY: Final = 8192
DEFAULT_BY: Final = "status page"
NO_TOKEN: Final = (
    "verdicts need a token (ui.token): without one, anybody who can reach the page could post them"
)
NO_BUS: Final = "this page has no bus to publish on"

Publisher = Callable[[verdicts.VerdictData], Awaitable[verdicts.VerdictEvent]]


def publisher(bus: base.Bus, settings: config.Settings) -> Publisher:
    """Verdicts published on ``bus`` as the CLI does (the cluster and prefix of ``settings``)."""
    subj = subjects.Subjects(settings.nats.prefix)

    async def publish(data: verdicts.VerdictData) -> verdicts.VerdictEvent:
        return await operator.publish_verdict(bus, subj, settings.controller.cluster, data)

    return publish


def why_not(ui: config.UiSettings, publish: Publisher | None) -> str | None:
    """None when the page takes verdicts, else the reason it does not."""
    if not ui.token:
        return NO_TOKEN
    return NO_BUS if publish is None else None


def parse(body: bytes) -> verdicts.VerdictData:
    """The request's JSON (``incident_id``, ``verdict``, optional ``by`` and ``note``) or ``ValueError``."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ValueError("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise ValueError("the body is not a JSON object")
    unknown = set(doc) - {"incident_id", "verdict", "by", "note"}
    if unknown:
        raise ValueError(f"unknown field(s): {', '.join(sorted(map(str, unknown)))}")
    incident_id = doc.get("incident_id")
    if not isinstance(incident_id, str):
        raise ValueError("incident_id is missing")
    operator.check_incident_id(incident_id)
    by = doc.get("by") or DEFAULT_BY
    try:
        return verdicts.VerdictData(
            incident_id=incident_id, verdict=doc.get("verdict"), by=by, note=doc.get("note") or ""
        )
    except pydantic.ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{where}: {first['msg']}") from None


def add_routes(
    app: web.Application, view: live.Live, ui: config.UiSettings, publish: Publisher | None
) -> None:
    """``GET /api/verdicts`` and ``POST /api/verdict`` on the page's app."""

    def refuse(status: int, why: str, **fields: Any) -> web.Response:
        view.stats["verdicts_refused"] = view.stats.get("verdicts_refused", 0) + 1
        log.warning("ui.verdict_refused", status=status, why=why, **fields)
        return web.Response(status=status, text=f"healer ui: {why}\n")

    async def state(request: web.Request) -> web.Response:
        why = why_not(ui, publish)
        return web.json_response(
            {"enabled": why is None, "why": why}, dumps=lambda o: orjson.dumps(o).decode()
        )

    async def post(request: web.Request) -> web.Response:
        why = why_not(ui, publish)
        if why is not None or publish is None:
            return refuse(403, why or NO_BUS)
        if request.content_type != "application/json":
            return refuse(415, "the body must be application/json")
        if request.content_length is not None and request.content_length > MAX_BODY:
            return refuse(413, f"the body is over {MAX_BODY} bytes")
        body = await request.content.read(MAX_BODY + 1)
        if len(body) > MAX_BODY:
            return refuse(413, f"the body is over {MAX_BODY} bytes")
        try:
            data = parse(body)
        except ValueError as e:
            return refuse(400, str(e))
        try:
            event = await publish(data)
        except errors.HealerError as e:
            log.warning("ui.verdict_unpublished", incident=data.incident_id, error=repr(e))
            return web.Response(status=503, text=f"healer ui: the verdict was not published: {e}\n")
        log.info("ui.verdict", incident=data.incident_id, verdict=str(data.verdict), by=data.by, id=event.id)
        answer = {
            "id": event.id,
            "incident_id": data.incident_id,
            "verdict": str(data.verdict),
            "by": data.by,
        }
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    app.router.add_get("/api/verdicts", state)
    app.router.add_post(PATH, post)
