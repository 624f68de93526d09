"""The two WebSocket moves every transport shell makes, with a closed connection as a plain value."""
from __future__ import annotations

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed


class ServerLink(ServerConnection):
    """websockets' server connection, freed by reference counting once it is closed.

    A closed protocol waits in its `discard()` parser for ever, and that suspended generator
    holds the protocol: a cycle that only the cyclic collector frees. Closing the parser once
    the connection is lost (nothing feeds it after that) breaks it, so a finished conversation's
    buffers go back at once (tests/test_no_cycles.py)."""

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.protocol.parser.close()


async def send_all(ws, *messages: str | bytes) -> None:
    """Send in order; a peer that has gone is not an error (the session learns it on receive)."""
    try:
        for m in messages:
            await ws.send(m)
    except ConnectionClosed:
        pass


async def recv_or_none(ws) -> str | bytes | None:
    """The next message, or None once the peer has gone."""
    try:
        return await ws.recv()
    except ConnectionClosed:
        return None


def abnormal_close(ws) -> str | None:
    """Why a closed connection ended abnormally (lost without a close frame, a keepalive ping
    timeout, an error code), or None: still open, or closed normally (1000, 1001)."""
    if ws.close_code is None or ws.close_code in (1000, 1001):
        return None
    return str(ws.protocol.close_exc)
