"""The status page's HTTP server (aiohttp): the page, its script and style, a snapshot, one GPU's chart
data, one node's view (every GPU, XID and incident history, versions), search, and the live stream
(server-sent events). Read-only but for one route: an operator's verdict (``POST /api/verdict``, only
behind a token; healer.ui.verdict_api); every other route is GET or HEAD.

Security: it listens on loopback unless told otherwise, and refuses to listen anywhere else without a
token. With a token, every request must carry it: ``Authorization: Bearer <token>``, or ``?token=`` once
(the answer sets an HttpOnly, SameSite=Strict cookie and redirects to the same URL without it, so the
token leaves the address bar and the history). Every response forbids loading anything from anywhere but
this server (Content-Security-Policy ``default-src 'none'`` plus ``'self'`` for scripts, styles, images
and the event stream), so the page works on a machine with no outside network and cannot leak to one.

``start`` is what ``healer ui`` and the controller (``ui.enabled``) call: it starts the sources and the
site and returns a ``Running`` to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import importlib.resources
import ipaddress
import pathlib
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import orjson
import structlog
import yaml
from aiohttp import web

from healer import config, errors
from healer.bus import nats as natsbus
from healer.bus import subjects
from healer.ui import board, fleet, live, reliability, sources, verdict_api, views

log = structlog.get_logger(__name__)

COOKIE = "healer_ui_token"
STATIC = {
    "page.js": "text/javascript",
    "map.js": "text/javascript",
    "panels.js": "text/javascript",
    "node_view.js": "text/javascript",
    "app.js": "text/javascript",
    "chart.js": "text/javascript",
    "verdicts.js": "text/javascript",
    "reliability.js": "text/javascript",
    "style.css": "text/css",
    "icon.svg": "image/svg+xml",
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
HEARTBEAT_S = 15.0
NO_ANOMALY = views.NO_ANOMALY
NO_VERSIONS = views.NO_VERSIONS
AnomalySource = views.AnomalySource
grafana_link = views.grafana_link


def _asset(name: str) -> bytes:
    return importlib.resources.files("healer.ui").joinpath("static", name).read_bytes()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check(ui: config.UiSettings) -> None:
    """Refuse what would expose the page: a non-loopback address without a token."""
    if not is_loopback(ui.host) and not ui.token:
        raise errors.PermanentError(
            f"refusing to serve the status page on {ui.host} without a token (set ui.token or --token, "
            "or listen on 127.0.0.1)"
        )


def listen_error(ui: config.UiSettings, e: OSError) -> str:
    """One line naming the settings to change when the page cannot listen."""
    why = e.strerror or e
    return f"cannot listen on {ui.host}:{ui.port}: {why} (set ui.port / --port, or ui.host / --host)"


def probe_port(ui: config.UiSettings) -> None:
    """``PermanentError`` (``listen_error``) when ``ui.host:ui.port`` cannot be bound now: ``healer ui``
    checks this before it connects to NATS, so a busy port is found first."""
    if ui.port == 0:
        return
    family = socket.AF_INET6 if ":" in ui.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp's listener does
        try:
            sock.bind((ui.host, ui.port))
        except OSError as e:
            raise errors.PermanentError(listen_error(ui, e)) from e


def inventory(cs: config.ControllerSettings) -> Callable[[], Iterable[str]] | None:
    """The admitted fleet from ``controller.inventory_file`` (admission ``file``), re-read on each call;
    an unreadable file logs and keeps the last names. ``None`` for another admission."""
    if cs.admission != "file" or not cs.inventory_file:
        return None
    path = cs.inventory_file
    last: set[str] = set()

    def names() -> Iterable[str]:
        nonlocal last
        from healer.controller.inventory import admission

        try:
            last = admission.read_inventory(path)
        except errors.PermanentError as e:
            log.warning("ui.inventory_unreadable", error=str(e), kept=len(last))
        return last

    return names


def page_labels(settings: config.Settings) -> dict[str, dict[str, str]]:
    """The labels the map groups by (``ui.group_by``) before any incident, from the files the
    controller's admission reads too (#27): each node's failure domains from ``controller.inventory_file``
    when ``controller.admission`` is ``file`` (``rack``, ``pdu`` ...), then its switches from
    ``controller.topology_file`` (Slurm's ``topology.conf``, any admission), then ``ui.labels_file``'s,
    which win. Inside the controller the page also gets the controller's own topology (``start``'s
    ``labels``: the scheduler's labels and features too)."""
    from healer.controller.inventory import topology

    cs = settings.controller
    domains: dict[str, dict[str, str]] = {}
    if cs.admission == "file" and cs.inventory_file:
        try:
            domains = topology.read_inventory(cs.inventory_file).domains
        except errors.PermanentError as e:
            log.warning("ui.inventory_unreadable", error=str(e), kept=0)
    if cs.topology_file:
        try:
            parsed = topology.read_topology_file(cs.topology_file)
        except errors.PermanentError as e:
            log.warning("ui.topology_unreadable", error=str(e))
        else:
            for node, switches in parsed.domains.items():
                domains[node] = {**domains.get(node, {}), **switches}
    files = load_labels(settings.ui.labels_file)
    return {n: {**domains.get(n, {}), **files.get(n, {})} for n in {*domains, *files}}


def load_labels(path: str | None) -> dict[str, dict[str, str]]:
    if not path:
        return {}
    try:
        doc = yaml.safe_load(pathlib.Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise errors.PermanentError(f"cannot read labels file {path}: {e}") from e
    if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
        raise errors.PermanentError(f"labels file {path}: expected a mapping node -> {{label: value}}")
    return {str(n): {str(k): str(v) for k, v in labels.items()} for n, labels in doc.items()}


def guard(ui: config.UiSettings) -> Any:
    """The middleware every request passes: GET and HEAD only (and POST on the verdict path), the token
    when there is one, and the headers that forbid loading anything from elsewhere."""

    @web.middleware
    async def check_request(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD") and (request.method, request.path) != (
            "POST",
            verdict_api.PATH,
        ):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"])
        if ui.token:
            given = request.query.get("token")
            if given is not None and hmac.compare_digest(given.encode(), ui.token.encode()):
                query = {k: v for k, v in request.query.items() if k != "token"}
                redirect = web.HTTPSeeOther(str(request.rel_url.with_query(query)))
                redirect.set_cookie(COOKIE, ui.token, httponly=True, samesite="Strict", path="/")
                raise redirect
            header = request.headers.get("Authorization", "")
            token = (
                header.removeprefix("Bearer ")
                if header.startswith("Bearer ")
                else request.cookies.get(COOKIE)
            )
            if token is None or not hmac.compare_digest(token.encode(), ui.token.encode()):
                return web.Response(status=401, text="healer ui: a token is needed (?token=...)\n")
        resp = await handler(request)
        if resp.prepared:  # the event stream sets its own headers before it starts
            return resp
        resp.headers["Content-Security-Policy"] = CSP
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "no-referrer"
        resp.headers.setdefault("Cache-Control", "no-store")
        return resp

    return check_request


def event_stream(
    live: live.Live, stopping: asyncio.Event
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """``/api/events``: the snapshot, then every change, as server-sent events, a ping when quiet."""

    async def events(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        resp.headers["Content-Security-Policy"] = CSP
        resp.headers["X-Content-Type-Options"] = "nosniff"
        await resp.prepare(request)
        client, first = live.connect()
        try:
            await resp.write(b"retry: 2000\n\n" + first)
            while not stopping.is_set():
                try:
                    msg = await asyncio.wait_for(client.queue.get(), HEARTBEAT_S)
                except TimeoutError:
                    msg = b": ping\n\n"
                if msg is None:
                    break
                await resp.write(msg)
                live.stats["sent_bytes"] += len(msg)
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            live.disconnect(client)
        return resp

    return events


def build_app(
    live: live.Live,
    ui: config.UiSettings,
    anomaly: AnomalySource | None = None,
    stopping: asyncio.Event | None = None,
    verdicts: verdict_api.Publisher | None = None,
    figures: reliability.Reliability | None = None,
) -> web.Application:
    assets = {name: _asset(name) for name in STATIC}
    index = _asset("index.html")
    stopping = stopping or asyncio.Event()

    async def page(request: web.Request) -> web.Response:
        return web.Response(body=index, content_type="text/html", charset="utf-8")

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in assets:
            raise web.HTTPNotFound()
        resp = web.Response(body=assets[name], content_type=STATIC[name])
        resp.headers["Cache-Control"] = "no-cache"
        return resp

    async def snapshot(request: web.Request) -> web.Response:
        resp = web.Response(body=orjson.dumps(live.snapshot()), content_type="application/json")
        resp.enable_compression()
        return resp

    async def gpu(request: web.Request) -> web.Response:
        node = request.query.get("node", "")
        try:
            index = int(request.query.get("gpu", ""))
        except ValueError:
            raise web.HTTPBadRequest(text="gpu must be an integer\n") from None
        data = views.gpu_view(live, ui, anomaly, node, index)
        if data is None:
            raise web.HTTPNotFound(text=f"no GPU {index} on node {node!r}\n")
        return web.Response(body=orjson.dumps(data), content_type="application/json")

    async def node_view(request: web.Request) -> web.Response:
        name = request.query.get("node", "")
        data = views.node_view(live, ui, name)
        if data is None:
            raise web.HTTPNotFound(text=f"no node {name!r}\n")
        return web.Response(body=orjson.dumps(data), content_type="application/json")

    async def search(request: web.Request) -> web.Response:
        live.sync_nodes()
        found = live.fleet.find(request.query.get("q", "")[:253])
        return web.Response(body=orjson.dumps(found), content_type="application/json")

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application(middlewares=[guard(ui)])
    verdict_api.add_routes(app, live, ui, verdicts)
    reliability.add_routes(
        app, figures or reliability.Reliability(None, subjects.Subjects(), ui, lambda: None)
    )
    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/snapshot", snapshot)
    app.router.add_get("/api/gpu", gpu)
    app.router.add_get("/api/node", node_view)
    app.router.add_get("/api/search", search)
    app.router.add_get("/api/events", event_stream(live, stopping))
    app.router.add_get("/healthz", healthz)
    return app


@dataclasses.dataclass
class Running:
    url: str
    live: live.Live
    sources: sources.Sources | None
    runner: web.AppRunner
    stopping: asyncio.Event

    async def stop(self) -> None:
        self.stopping.set()
        for client in list(self.live.clients):
            with contextlib.suppress(asyncio.QueueFull):
                client.queue.put_nowait(None)
        if self.sources is not None:
            await self.sources.stop()
        await self.runner.cleanup()


async def serve(
    live: live.Live,
    ui: config.UiSettings,
    *,
    sources: sources.Sources | None = None,
    anomaly: AnomalySource | None = None,
    verdicts: verdict_api.Publisher | None = None,
    figures: reliability.Reliability | None = None,
) -> Running:
    """Listen (sources already built, started here); ``PermanentError`` on a busy port or a bad host.
    ``verdicts``: how the page publishes an operator's verdict (none: the page takes none)."""
    check(ui)
    stopping = asyncio.Event()
    app = build_app(live, ui, anomaly, stopping, verdicts, figures)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, ui.host, ui.port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise errors.PermanentError(listen_error(ui, e)) from e
    port = runner.addresses[0][1] if runner.addresses else ui.port
    host = f"[{ui.host}]" if ":" in ui.host else ui.host
    running = Running(f"http://{host}:{port}/", live, sources, runner, stopping)
    if sources is not None:
        try:
            await sources.start()
        except BaseException:
            await running.stop()
            raise
    log.info("ui.listening", url=running.url)
    return running


async def start(
    bus: natsbus.NatsBus,
    settings: config.Settings,
    *,
    labels: Callable[[], Mapping[str, Mapping[str, str]]] | None = None,
    anomaly: AnomalySource | None = None,
    admitted: Callable[[], Iterable[str]] | None = None,
) -> Running:
    """The status page on ``bus``: what ``healer ui`` runs, and the one call ``healer controller`` makes
    when ``ui.enabled`` (passing its failure domains by node as ``labels``, its admitted nodes and, when
    it has them, anomaly components): the admitted fleet and its topology from the controller's one
    ``Admission``. Without ``admitted``, the admitted fleet is ``controller.inventory_file`` when
    ``controller.admission`` is ``file``. Stop it with ``await running.stop()``; the bus stays the
    caller's."""
    ui = settings.ui
    check(ui)
    view = live.Live(
        fleet.Fleet(
            settings.controller.gpus_per_node, ui.ring_len, max_nodes=ui.max_nodes,
            history_len=ui.history_len, history_step_s=ui.history_step_s,
        ),
        board.Board(),
        group_by=ui.group_by,
        stale_after_s=ui.stale_after_s,
        temp_deadband_c=ui.temp_deadband_c,
        title=f"healer · {settings.controller.cluster}",
        admitted=admitted or inventory(settings.controller),
        links={"grafana": ui.grafana_url},
    )  # fmt: skip
    view.extra_labels = view.static_labels = page_labels(settings)
    view.label_source = labels  # the controller's topology, asked again every ADMITTED_EVERY_S
    src = sources.Sources(
        bus, subjects.Subjects(settings.nats.prefix), view, feed_window_s=ui.feed_window_s, push_s=ui.push_s
    )
    publish = verdict_api.publisher(bus, settings)
    rel = reliability.Reliability(bus, subjects.Subjects(settings.nats.prefix), ui, lambda: fleet_gpus(view))
    return await serve(view, ui, sources=src, anomaly=anomaly, verdicts=publish, figures=rel)


def fleet_gpus(view: live.Live) -> int | None:
    """The fleet's GPUs as the page's map has them (its nodes x GPUs per node); None before any node."""
    return len(view.fleet.names) * view.fleet.gpus or None
