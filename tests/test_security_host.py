"""DNS rebinding (issue 40): a page on evil.example whose name is made to resolve to 127.0.0.1 is
same-origin with the server in the browser's eyes, so its Origin matches its Host and the Origin
check alone lets it in. Every request's Host must name this server: an IP literal, a loopback
name, --host, --allowed-host or --public-url's host. Raw HTTP over loopback, so that the test
sets the Host header itself, as the rebound browser would."""
from __future__ import annotations

import asyncio
import base64
import os

from test_serving import serving


async def status_of(port: int, path: str, host: str | None, origin: str | None = None, upgrade: bool = False) -> int:
    """The status line's code of one request to 127.0.0.1:port sent with `host` as its Host
    (None: an HTTP/1.0 request without one, as HAProxy's `option httpchk` sends)."""
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}"] if host is not None else [f"GET {path} HTTP/1.0"]
    if origin is not None:
        lines.append(f"Origin: {origin}")
    if upgrade:
        lines += ["Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13",
                  f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}"]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 10)
        return int(status_line.split()[1])
    finally:
        writer.close()


async def test_a_rebound_name_is_refused_on_every_route():
    async with serving() as s:
        evil = f"evil.example:{s.port}"
        origin = f"http://{evil}"
        assert await status_of(s.port, "/ws", evil, origin, upgrade=True) == 403
        assert await status_of(s.port, "/exotel", evil, upgrade=True) == 403
        for path in ("/", "/webrtc/config", "/metrics"):
            assert await status_of(s.port, path, evil, origin) == 403, path
        assert s.admission.live == 0


async def test_loopback_names_ip_literals_and_listed_hosts_are_served():
    async with serving(allowed_hosts=["agent.example"]) as s:
        for host in (f"127.0.0.1:{s.port}", f"localhost:{s.port}", f"[::1]:{s.port}", "192.0.2.7",
                     f"Agent.Example.:{s.port}", f"app.localhost:{s.port}"):
            assert await status_of(s.port, "/", host) == 200, host
        own = f"agent.example:{s.port}"
        assert await status_of(s.port, "/ws", own, f"http://{own}", upgrade=True) == 101
        assert await status_of(s.port, "/", f"other.example:{s.port}") == 403
    async with serving(public_url="wss://voice.example/agent") as s:
        assert await status_of(s.port, "/", "voice.example") == 200
        assert await status_of(s.port, "/", "agent.example") == 403


async def test_a_probe_without_host_is_served_and_nothing_else_is():
    """A load balancer's HTTP/1.0 health check sends no Host; a browser always sends one, so such a
    request cannot be a rebound page. Only the probes answer it."""
    async with serving() as s:
        assert await status_of(s.port, "/healthz", None) == 200
        assert await status_of(s.port, "/readyz", None) == 200
        for path in ("/", "/metrics", "/webrtc/config"):
            assert await status_of(s.port, path, None) == 400, path
