"""The two WebSocket moves every transport shell makes, with a closed connection as a plain value."""
from __future__ import annotations

from websockets.exceptions import ConnectionClosed


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
