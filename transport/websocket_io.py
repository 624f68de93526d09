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
