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

from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from transport.audio import Int16RateAdapter
from transport.base import AudioIn, AudioOut, ClientEvent, InputEvent, Played, Transport
from transport.events import SessionEvent
from transport.websocket_io import recv_or_none, send_all
from transport.web.protocol import (
    ClientAudio, ProtocolError, decode_client, encode_audio, encode_event, error_event)

log = logging.getLogger("duplex.web")
STATIC = Path(__file__).parent / "static"


def server_ms() -> float:
    """The server clock the page aligns to: time.perf_counter(), the sessions' and tracer's clock."""
    return time.perf_counter() * 1000.0


class WebSocketTransport:
    """One browser connection. Protocol errors are answered with an error event; the session goes on."""

    reports_playout = True

    def __init__(self, ws: ServerConnection, output_sample_rate: int):
        self.ws = ws
        self.input_sample_rate = 16000
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


def _path(request: Request) -> str:
    return request.path.split("?")[0]


async def run_server(handler: Handler, host: str, port: int, output_sample_rate: int,
                     ready: asyncio.Event | None = None, max_connections: int = 16,
                     routes: dict[str, TransportFactory] | None = None) -> None:
    """Serve until cancelled. `handler(transport)` runs one conversation per WebSocket: the
    browser's at /ws, and one more transport per path in `routes` (a phone media stream, say)."""
    live = 0
    factories: dict[str, TransportFactory] = {"/ws": lambda ws: WebSocketTransport(ws, output_sample_rate),
                                              **(routes or {})}

    def process_request(connection: ServerConnection, request: Request):
        if _path(request) in factories:
            if live >= max_connections:
                return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "too many sessions\n")
            return None
        return _static_response(_path(request))

    async def on_ws(ws: ServerConnection) -> None:
        nonlocal live
        live += 1
        try:
            await handler(factories[_path(ws.request)](ws))
        except Exception:
            log.exception("session failed")
            if _path(ws.request) == "/ws":  # the page shows errors; a phone peer reads none
                await send_all(ws, error_event("internal", "the session failed; see the server log"))
        finally:
            live -= 1

    async with serve(on_ws, host, port, process_request=process_request, max_size=1 << 20,
                     max_queue=64) as server:
        bound = [s.getsockname() for s in server.sockets]
        log.info("duplex serving on http://%s:%s/", *bound[0][:2])
        print(f"duplex: open http://{host}:{bound[0][1]}/ in a browser", flush=True)
        if ready is not None:
            ready.set()
        await asyncio.Future()
