"""Limits that match each protocol (issue 40): /ws takes frames up to 64 KiB (the page's largest is
48000 bytes), closing the connection on a larger one, and negotiates no compression; a
Content-Length it cannot read is answered 400 with one log line and no traceback; an AudioSocket
close gives up on a peer that never reads. Real loopback sockets throughout."""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import time

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from test_serving import serving
from transport.telephony.audiosocket_server import AudioSocketTransport

pytestmark = pytest.mark.usefixtures("virtual_clock")


async def next_event(ws, kind: str) -> dict:
    while True:
        message = await asyncio.wait_for(ws.recv(), 10)
        if isinstance(message, str) and (event := json.loads(message))["type"] == kind:
            return event


async def test_ws_frames_over_the_protocol_get_an_error_and_over_64_kib_close_the_connection():
    async with serving() as s:
        async with connect(s.url("/ws"), max_size=None) as ws:
            await ws.send(b"\x00" * 60_000)  # over the protocol's 48000: told, the session goes on
            assert (await next_event(ws, "error"))["code"] == "frame_too_large"
            await ws.send(json.dumps({"type": "ping", "t": 1}))
            await next_event(ws, "pong")
            await ws.send(b"\x00" * 100_000)  # over the frame limit: closed, "message too big"
            try:
                while True:
                    await asyncio.wait_for(ws.recv(), 10)
            except ConnectionClosed:
                pass
            assert ws.close_code == 1009, ws.close_code


async def test_no_compression_is_negotiated_on_the_audio_routes():
    async with serving() as s:
        for route in ("/ws", "/twilio", "/vonage"):
            async with connect(s.url(route), compression="deflate") as ws:  # the client offers it
                assert "Sec-WebSocket-Extensions" not in ws.response.headers, route


async def raw_status(port: int, request: bytes) -> int | None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 10)
        return int(line.split()[1]) if line else None
    finally:
        writer.close()


async def test_an_unreadable_content_length_is_answered_400_without_a_traceback(caplog):
    caplog.set_level(logging.INFO)
    errors: list[dict] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        async with serving() as s:
            head = f"POST /webrtc/offer HTTP/1.1\r\nHost: 127.0.0.1:{s.port}\r\nContent-Type: application/json\r\n"
            for length in ("9" * 5000, "12abc", "-1", "1" * 20):
                request = (head + f"Content-Length: {length}\r\n\r\n{{}}").encode()
                assert await raw_status(s.port, request) == 400, length[:20]
            assert s.admission.live == 0
    finally:
        loop.set_exception_handler(None)
    assert not errors, errors  # asyncio's "Fatal error: protocol.data_received() call failed"
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]
    assert len([r for r in caplog.records if "Content-Length" in r.getMessage()]) == 4


async def test_an_audiosocket_close_gives_up_on_a_peer_that_never_reads():
    accepted: asyncio.Future = asyncio.get_running_loop().create_future()

    async def never_reads(reader, writer):
        accepted.set_result(writer)
        await asyncio.Event().wait()

    server = await asyncio.start_server(never_reads, "127.0.0.1", 0)
    server.sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    peer_writer = await asyncio.wait_for(accepted, 10)
    try:
        writer.write(b"\x00" * (8 << 20))  # far more than the kernel holds: the rest waits here
        transport = AudioSocketTransport(reader, writer)
        start = time.monotonic()
        await asyncio.wait_for(transport.close(), 10)
        assert time.monotonic() - start < 5
        assert writer.transport.is_closing()
    finally:
        peer_writer.transport.abort()
        server.close()


async def test_a_malformed_head_is_answered_400_with_one_log_line(caplog):
    caplog.set_level(logging.INFO)
    async with serving() as s:
        host = f"Host: 127.0.0.1:{s.port}\r\n"
        heads = [f"GET /ws HTTP/2.0\r\n{host}\r\n",  # a protocol websockets does not speak
                 f"GET /caf\u00e9 HTTP/1.1\r\n{host}\r\n",  # a path that is not ASCII
                 f"GET / HTTP/1.1\r\n{host}Bad Name: x\r\n\r\n",  # a header name with a space
                 f"GET / HTTP/1.1\r\n{host}no colon here\r\n\r\n",
                 f"GET /healthz HTTP/1.1\r\n{host}Content-Length: 5\r\n\r\nhello",  # a GET with a body
                 f"GET /healthz HTTP/1.1\r\n{host}Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"]
        for head in heads:
            assert await raw_status(s.port, head.encode()) == 400, head
        assert await raw_status(s.port, f"GET /healthz HTTP/1.1\r\n{host}Content-Length: 0\r\n\r\n".encode()) == 200
    assert len([r for r in caplog.records if "unreadable request" in r.getMessage()]) == len(heads)
    assert not [r for r in caplog.records if r.exc_info]
