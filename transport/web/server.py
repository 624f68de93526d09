"""asyncio shell for the browser transport: serves the page over HTTP and each /ws connection as a
`Transport`. The conversation handler is injected, so this module knows nothing of the agent."""
from __future__ import annotations

import asyncio
import logging
import mimetypes
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from pathlib import Path
from ssl import SSLContext

from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from transport.admission import Admission
from transport.audio import INPUT_RATE, Int16RateAdapter
from transport.base import AudioIn, AudioOut, ClientEvent, InputEvent, Played, Transport
from transport.credentials import header
from transport.events import SessionEvent
from transport.limits import SourceLimits, source_of
from transport.websocket_io import ServerLink, abnormal_close, recv_or_none, send_all
from transport.web.access import BrowserAccess
from transport.web.request_body import BodyConnection
from transport.web.protocol import (
    MAX_AUDIO_BYTES, ClientAudio, ProtocolError, decode_client, encode_audio, encode_event, error_event)

log = logging.getLogger("duplex.web")
STATIC = Path(__file__).parent / "static"
# the protocol's largest frame (0.5 s of 48 kHz audio) fits with room; a frame between the
# protocol's limit and this one gets a clear error event, a larger one closes the connection
MAX_FRAME_BYTES = 64 * 1024
PROBE_ROUTES = frozenset({"/healthz", "/readyz"})
assert MAX_FRAME_BYTES > MAX_AUDIO_BYTES


def server_ms() -> float:
    """The server clock the page aligns to: time.perf_counter(), the sessions' and tracer's clock."""
    return time.perf_counter() * 1000.0


class WebSocketTransport:
    """One browser connection. Protocol errors are answered with an error event; the session goes on."""

    reports_playout = True

    def __init__(self, ws: ServerConnection, output_sample_rate: int):
        self.ws = ws
        self.input_sample_rate = INPUT_RATE
        self.output_sample_rate = output_sample_rate
        self._to_output_rate = Int16RateAdapter(output_sample_rate)
        self.errors = 0

    async def _send(self, message: str | bytes) -> None:
        await send_all(self.ws, message)

    async def receive(self) -> InputEvent | None:
        while True:
            message = await recv_or_none(self.ws)
            if message is None:
                return None
            try:
                decoded = decode_client(message)
            except ProtocolError as exc:
                self.errors += 1
                await self._send(error_event(exc.code, str(exc)))
                continue
            if isinstance(decoded, ClientAudio):
                return AudioIn(decoded.pcm, self.input_sample_rate)
            kind, data = decoded.type, decoded.data
            if kind == "hello":
                self.input_sample_rate = data["sample_rate"]
                await self._send(encode_event({"type": "ready", "sample_rate": self.output_sample_rate,
                                               "input_sample_rate": self.input_sample_rate,
                                               "server_ms": server_ms()}))
            elif kind == "ping":
                await self._send(encode_event({"type": "pong", "t": data["t"], "server_ms": server_ms()}))
            elif kind == "played":
                est = data["server_ms"]
                return Played(data["id"], data["event"], est / 1000.0 if est is not None else None)
            else:
                return ClientEvent(kind, data)

    async def send_audio(self, chunk: AudioOut) -> None:
        await self._send(encode_audio(chunk.chunk_id, self._to_output_rate(chunk.pcm, chunk.sample_rate)))

    async def clear(self) -> None:
        await self._send(encode_event({"type": "clear"}))

    async def send_event(self, event: SessionEvent) -> None:
        await self._send(encode_event(event.to_wire()))

    def abnormal_end(self) -> str | None:
        """Why the page's connection was lost (no close frame, a keepalive timeout), or None."""
        return abnormal_close(self.ws)


def _static_response(path: str) -> Response:
    name = "index.html" if path in ("/", "/index.html") else path.removeprefix("/static/")
    file = (STATIC / name).resolve()
    if STATIC.resolve() not in file.parents or not file.is_file():
        return Response(404, "Not Found", Headers([("Content-Type", "text/plain")]), b"not found\n")
    ctype = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
    if file.suffix == ".js":
        ctype = "text/javascript"
    body = file.read_bytes()
    return Response(200, "OK", Headers([("Content-Type", ctype), ("Content-Length", str(len(body))),
                                        ("Cache-Control", "no-store")]), body)


Handler = Callable[[Transport], Awaitable[None]]
TransportFactory = Callable[[ServerConnection], Transport]
# an HTTP GET answered by the caller's code (e.g. /metrics): () -> (status, headers, body)
HttpRoute = Callable[[], tuple[int, dict[str, str], bytes]]
# who may open a route: the upgrade request -> None to let it through, or (status, reason) to refuse
Guard = Callable[[Request], tuple[HTTPStatus, str] | None]
# a GET answered by the caller's code behind `access`, as /ws (e.g. /webrtc/config): the request
# -> (status, headers, body)
GuardedRoute = Callable[[Request], tuple[int, dict[str, str], bytes]]
# a POST answered by the caller's code (e.g. /webrtc/offer): (request, its body, the caller's
# address) -> (status, headers, body); guarded by `access` and refused with 503 while
# `admission` refuses, as /ws
PostRoute = Callable[[Request, bytes, str | None], Awaitable[tuple[int, dict[str, str], bytes]]]


def _text(status: HTTPStatus, text: str) -> Response:
    body = text.encode()
    return Response(status.value, status.phrase, Headers([("Content-Type", "text/plain; charset=utf-8"),
                                                          ("Content-Length", str(len(body))),
                                                          ("Cache-Control", "no-store")]), body)


def _refused(refusal: tuple[HTTPStatus, str]) -> Response:
    response = _text(*refusal)
    if refusal[0] == HTTPStatus.UNAUTHORIZED:
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


def _answer(status: int, headers: dict[str, str], body: bytes) -> Response:
    """A route's own answer (an offer's, the WebRTC config), never cached."""
    return Response(status, HTTPStatus(status).phrase, Headers(
        [*headers.items(), ("Content-Length", str(len(body))), ("Cache-Control", "no-store")]), body)


def _probe(admission: Admission, path: str, reasons: bool = True) -> Response:
    """/healthz: the process answers. /readyz: it admits conversations now (a load balancer
    sends new ones elsewhere while it is 503), and why not when `reasons`."""
    if path == "/healthz":
        return _text(HTTPStatus.OK, "ok\n")
    reason = admission.reason
    if reason is None:
        return _text(HTTPStatus.OK, "ready\n")
    return _text(HTTPStatus.SERVICE_UNAVAILABLE, f"not ready: {reason}\n" if reasons else "not ready\n")


def _route_answer(route: HttpRoute) -> Response:
    status, headers, body = route()
    return Response(status, HTTPStatus(status).phrase,
                    Headers([*headers.items(), ("Content-Length", str(len(body)))]), body)


async def run_ops_server(http_routes: dict[str, HttpRoute], admission: Admission, host: str, port: int,
                         ready: asyncio.Event | None = None) -> None:
    """The operators' port (`--metrics-port`): `http_routes` (/metrics), /healthz and /readyz
    with its reasons, and nothing else, so that a proxy in front of the main port shows none of
    it. Serves until cancelled."""
    def process_request(connection: ServerConnection, request: Request) -> Response:
        path = _path(request)
        if path in PROBE_ROUTES:
            return _probe(admission, path)
        if path in http_routes:
            return _route_answer(http_routes[path])
        return _text(HTTPStatus.NOT_FOUND, "not found\n")

    async def never(ws: ServerConnection) -> None:  # every request is answered above
        await ws.close()

    async with serve(never, host, port, process_request=process_request, max_size=1024, compression=None,
                     create_connection=ServerLink) as server:
        log.info("duplex operators' port on %s:%s (/metrics, /healthz, /readyz)", *server.sockets[0].getsockname()[:2])
        if ready is not None:
            ready.set()
        await asyncio.Future()


def _path(request: Request) -> str:
    return request.path.split("?")[0]


async def run_server(handler: Handler, host: str, port: int, output_sample_rate: int,
                     ready: asyncio.Event | None = None, admission: Admission | None = None,
                     routes: dict[str, TransportFactory] | None = None,
                     http_routes: dict[str, HttpRoute] | None = None,
                     access: BrowserAccess | None = None, guards: dict[str, Guard] | None = None,
                     busy: Handler | None = None, ssl: SSLContext | None = None,
                     post_routes: dict[str, PostRoute] | None = None,
                     guarded_routes: dict[str, GuardedRoute] | None = None,
                     limits: SourceLimits | None = None, probe_reasons: bool = True) -> None:
    """Serve until cancelled. `handler(transport)` runs one conversation per WebSocket: the
    browser's at /ws, and one more transport per path in `routes` (a phone media stream, say).
    `admission` (default: 16 at once) refuses conversations beyond it with 503 before the
    upgrade; `access` guards /ws (token, Origin), `guards` the other routes (a carrier's
    signature); `http_routes` answer more GET paths. `busy(transport)` tells a refused phone
    call why (it is let in to hear it) before it is closed. `ssl`: serve HTTPS and WSS.
    `post_routes`: POST paths with a bounded body (transport/web/request_body.py), e.g. the
    WebRTC offer, behind the same `access` and `admission` as /ws. `guarded_routes`: GET paths
    behind `access` only (the page's WebRTC config: asking for it starts no conversation).
    `limits`: per-address limits (default: transport/limits.py's) on the browser's routes and on
    phone routes without a guard; a carrier's authenticated calls share its few addresses.
    `probe_reasons`: /readyz says why it refuses (False: the status alone, where the reasons are
    served on an operators' port of their own, `run_ops_server`)."""
    admission = admission or Admission()
    access = access or BrowserAccess()
    guards = {"/ws": access.refusal, **(guards or {})}
    factories: dict[str, TransportFactory] = {"/ws": lambda ws: WebSocketTransport(ws, output_sample_rate),
                                              **(routes or {})}
    http_routes = http_routes or {}
    post_routes = post_routes or {}
    guarded_routes = guarded_routes or {}
    limits = limits or SourceLimits()
    limited = {"/ws", *post_routes, *guarded_routes, *(p for p in factories if p not in guards)}

    def caller(remote_address, request: Request) -> str | None:
        """The address a request is counted by (a trusted proxy's X-Forwarded-For, else the peer)."""
        return limits.client(source_of(remote_address), header(request, "X-Forwarded-For"))

    def over_limit(connection: BodyConnection, request: Request, path: str) -> Response | None:
        if path not in limited or (reason := limits.refusal(caller(connection.remote_address, request))) is None:
            return None
        log.warning("refused %s %s from %s: %s", request.method[:16], path, connection.remote_address, reason)
        response = _text(HTTPStatus.TOO_MANY_REQUESTS, reason + "\n")
        response.headers["Retry-After"] = "60"
        return response

    async def process_post(connection: BodyConnection, request: Request, path: str) -> Response:
        if path not in post_routes or request.method != "POST":
            return _text(HTTPStatus.METHOD_NOT_ALLOWED, f"{request.method[:16]} is not served at {path}\n")
        refusal = access.refusal(request)
        if refusal is None:
            refusal = connection.splitter.body_error
        if refusal is None and (reason := admission.refuse()) is not None:
            log.info("refused a conversation at %s: %s", path, reason)
            refusal = HTTPStatus.SERVICE_UNAVAILABLE, f"not now: {reason}\n"
        if refusal is not None:
            log.warning("refused %s %s from %s: %s", request.method, path, connection.remote_address,
                        refusal[1].strip())
            return _refused(refusal)
        return _answer(*await post_routes[path](request, connection.splitter.body or b"",
                                                caller(connection.remote_address, request)))

    async def process_request(connection: BodyConnection, request: Request):
        path = _path(request)
        # DNS rebinding, on every route; a probe without any Host (HAProxy's HTTP/1.0 `option
        # httpchk`) is served: a browser always sends one, so it cannot be a rebound page
        probe_without_host = path in PROBE_ROUTES and not request.headers.get_all("Host")
        if not probe_without_host and (refusal := access.host_refusal(request)) is not None:
            log.warning("refused %s %s from %s: %s", request.method[:16], path[:100], connection.remote_address,
                        refusal[1].strip())
            return _refused(refusal)
        if (too_many := over_limit(connection, request, path)) is not None:
            return too_many
        if request.method != "GET":
            return await process_post(connection, request, path)
        if path in post_routes:
            return _text(HTTPStatus.METHOD_NOT_ALLOWED, f"{path} takes a POST\n")
        if path in factories:
            guard = guards.get(path)
            # a phone route is for carriers: a browser page (it sends an Origin) may not open it
            refusal = access.foreign_page(request) if path != "/ws" else None
            if refusal is None and guard is not None:
                refusal = guard(request)
            if refusal is not None:
                log.warning("refused %s from %s: %s", path, connection.remote_address, refusal[1].strip())
                return _refused(refusal)
            # a page is told before the upgrade; a phone call is let in to hear why (`busy`)
            if (busy is None or path == "/ws") and (reason := admission.refuse()) is not None:
                log.info("refused a conversation at %s: %s", path, reason)
                return _text(HTTPStatus.SERVICE_UNAVAILABLE, f"not now: {reason}\n")
            return None
        if path in guarded_routes:
            if (refusal := access.refusal(request)) is not None:
                log.warning("refused %s from %s: %s", path, connection.remote_address, refusal[1].strip())
                return _refused(refusal)
            return _answer(*guarded_routes[path](request))
        if path in PROBE_ROUTES:
            return _probe(admission, path, probe_reasons)
        if path in http_routes:
            return _route_answer(http_routes[path])
        return _static_response(path)

    async def on_ws(ws: ServerConnection) -> None:
        path = _path(ws.request)
        source = caller(ws.remote_address, ws.request) if path in limited else None
        if not limits.enter(source):  # handshakes from one address passed its check at once
            await ws.close(1013, "too many conversations from your address")
            return
        try:
            if (reason := admission.enter()) is not None:  # handshakes passed at once, or a phone call
                log.info("refused a conversation at %s: %s", path, reason)
                if busy is not None and path != "/ws":
                    await busy(factories[path](ws))
                await ws.close(1013, f"try again later: {reason}"[:120])
                return
            try:
                await handler(factories[path](ws))
            except Exception:
                log.exception("session failed")
                if path == "/ws":  # the page shows errors; a phone peer reads none
                    await send_all(ws, error_event("internal", "the session failed; see the server log"))
            finally:
                admission.leave()
        finally:
            limits.leave(source)

    # no compression: a frame's size on the wire is what it costs here (a few KB of deflated
    # zeros would otherwise queue megabytes)
    async with serve(on_ws, host, port, process_request=process_request, max_size=MAX_FRAME_BYTES,
                     max_queue=64, compression=None, ssl=ssl, create_connection=BodyConnection) as server:
        bound = [s.getsockname() for s in server.sockets]
        scheme = "https" if ssl is not None else "http"
        log.info("duplex serving on %s://%s:%s/", scheme, *bound[0][:2])
        print(f"duplex: open {scheme}://{host}:{bound[0][1]}/ in a browser", flush=True)
        if ready is not None:
            ready.set()
        await asyncio.Future()
