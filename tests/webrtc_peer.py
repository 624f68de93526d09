"""The tests' WebRTC peer: transport/webrtc/client.py (aiortc, not the page), on 127.0.0.1 only.

Run as a script (`python tests/webrtc_peer.py URL`), it connects, streams silence and never
closes: the vanishing-peer test kills it."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transport.webrtc.client import Peer, post  # noqa: F401 (the tests' imports)
from transport.webrtc.client import connect as _connect

LOOPBACK = ("127.0.0.1",)


async def connect(base_url: str, *args, **kwargs) -> Peer:
    return await _connect(base_url, *args, ice_hosts=LOOPBACK, **kwargs)


async def _linger(url: str) -> None:
    peer = await connect(url)
    while peer.pc.connectionState != "connected":
        await asyncio.sleep(0.05)
    print("connected", flush=True)
    await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(_linger(sys.argv[1]))
