"""A client of Kyutai's ASR WebSocket protocol (moshi-server, `duplex asr-serve`) as a
`StreamingRecognizer`: a conversation can use a recognizer pool on other machines.

- URLs: `ws://HOST:PORT` or `wss://…`, path `/api/asr-streaming` unless one is given; several,
  comma-separated (or a list). Opening tries them in random order and takes the first that
  answers `Ready`; one that is full ("no free slot"/"no free channels", HTTP 503), refuses the
  connection, wants another key or times out is skipped. All fail: `RecognizerUnavailable`
  naming each URL's reason.
- Key: header `kyutai-api-key` (moshi-server's; `None` sends its default `public_token`, `""`
  sends none).
- A connection lost mid-stream is replaced (the next URL first, retrying for
  `reconnect_timeout_s`); the stream emits a `Gap` for the audio no recognizer transcribed and
  goes on, the caller's clock unbroken. An eviction by the server (idle, too long) is final.
- Backpressure: audio goes through a bounded send queue to one sender task whose `send` waits
  while the socket's write buffer is full, so a server that stops reading (its input buffer
  is full) stops `feed`.

Messages are encoded and decoded by asr.moshi_protocol; the stream logic is asr.moshi_stream's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from asr.base import RecognizerFailed, RecognizerUnavailable
from asr.moshi_protocol import (
    Audio,
    Error,
    Marker,
    ProtocolError,
    Ready,
    ServerMessage,
    decode_server,
    encode_client,
    parse_server,
)
from asr.moshi_stream import LinkLost, MoshiLink, MoshiStream

PATH = "/api/asr-streaming"
DEFAULT_API_KEY = "public_token"  # moshi-server's default authorized id
DEFAULT_DELAY_S = 0.5  # kyutai/stt-1b-en_fr; the protocol does not say (stt-2.6b-en: 2.5)
SEND_QUEUE_FRAMES = 32  # messages waiting for the socket (each at most ~1 s of audio)

log = logging.getLogger("duplex.asr.remote")

_HTTP_REASONS = {
    401: "HTTP 401: missing or wrong API key (kyutai-api-key)",
    403: "HTTP 403: forbidden",
    404: f"HTTP 404: no ASR endpoint at this path (moshi-server serves {PATH})",
    503: "HTTP 503: server full or not ready",
}


def normalize_url(url: str) -> str:
    """`ws://host:port` → `ws://host:port/api/asr-streaming`; ValueError for anything not ws(s)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"not a recognizer URL (want ws://HOST:PORT or wss://…): {url!r}")
    path = parts.path if parts.path not in ("", "/") else PATH
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def split_urls(urls: str | Sequence[str]) -> list[str]:
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    out = [normalize_url(u) for u in items if u.strip()]
    if not out:
        raise ValueError("no recognizer URL given")
    return out


def _describe_close(e: ConnectionClosed) -> str:
    frame = e.rcvd or e.sent
    if frame is None:
        return "connection lost (no close frame)"
    return f"connection closed ({frame.code}{' ' + frame.reason if frame.reason else ''})"


class _Refused(Exception):
    """This URL cannot take a stream now; the message says why."""


class WebSocketLink:
    """A `MoshiLink` over one WebSocket connection that has answered `Ready`."""

    def __init__(self, ws: ClientConnection, url: str, send_queue_frames: int = SEND_QUEUE_FRAMES):
        self.ws, self.url = ws, url
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(send_queue_frames)
        self._lost: str | None = None
        self._sender = asyncio.create_task(self._send_loop(), name=f"asr-remote-sender {url}")

    async def _send_loop(self) -> None:
        try:
            while True:
                frame = await self._queue.get()
                await self.ws.send(frame)  # waits while the socket's buffer is full: the server's backpressure
        except ConnectionClosed as e:
            self._lost = _describe_close(e)
        except Exception as e:
            self._lost = f"send failed: {type(e).__name__}: {e}"
            with contextlib.suppress(Exception):
                await self.ws.close(1011, "client send failed")
        finally:
            self._lost = self._lost or "sender stopped"
            while not self._queue.empty():  # wake a feed waiting for room; it then sees the loss
                self._queue.get_nowait()

    async def _put(self, frame: bytes) -> None:
        if self._lost:
            raise LinkLost(self._lost)
        await self._queue.put(frame)
        if self._lost:
            raise LinkLost(self._lost)

    async def send_audio(self, pcm: np.ndarray) -> None:
        await self._put(encode_client(Audio(pcm)))

    async def send_marker(self, marker_id: int) -> None:
        await self._put(encode_client(Marker(marker_id)))

    async def receive(self) -> list[ServerMessage]:
        try:
            raw = await self.ws.recv()
        except ConnectionClosed as e:
            raise LinkLost(_describe_close(e)) from None
        if isinstance(raw, str):
            return [Error(f"server sent a text frame: {raw[:80]!r}")]
        try:
            msg = parse_server(decode_server(raw))
        except ProtocolError as e:
            return [Error(str(e))]
        except Exception as e:  # msgpack raises several types on garbage
            return [Error(f"undecodable server message: {type(e).__name__}")]
        return [] if msg is None or isinstance(msg, Ready) else [msg]

    async def close(self) -> None:
        self._sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._sender
        with contextlib.suppress(Exception):
            await self.ws.close()


class RemoteRecognizer:
    """Streams on remote Kyutai-protocol servers, with failover and reconnection."""

    sample_rate = 24000

    def __init__(self, urls: str | Sequence[str], api_key: str | None = None, *, delay_s: float = DEFAULT_DELAY_S,
                 open_timeout_s: float = 5.0, reconnect_timeout_s: float = 10.0, shuffle: bool = True,
                 send_queue_frames: int = SEND_QUEUE_FRAMES, events_max: int = 512):
        self.urls = split_urls(urls)
        self.api_key = DEFAULT_API_KEY if api_key is None else api_key
        self.delay_s = delay_s
        self.open_timeout_s, self.reconnect_timeout_s = open_timeout_s, reconnect_timeout_s
        self.shuffle = shuffle
        self._send_queue_frames, self._events_max = send_queue_frames, events_max
        self.name = "remote " + ",".join(self.urls)

    async def open_stream(self) -> MoshiStream:
        order = list(self.urls)
        if self.shuffle:
            random.shuffle(order)
        link = await self._connect_any(order)
        return MoshiStream(link, delay_s=self.delay_s, name=f"remote {link.url}", sample_rate=self.sample_rate,
                           reopen=self._reopen, events_max=self._events_max)

    # ---- connecting ------------------------------------------------------------------------
    async def _reopen(self, lost: MoshiLink) -> WebSocketLink:
        """A new link after `lost`: the other URLs first, retried with backoff until
        `reconnect_timeout_s` has passed (a restarting server gets the time to come back)."""
        urls = self.urls
        i = urls.index(lost.url) if getattr(lost, "url", None) in urls else -1
        order = urls[i + 1:] + urls[:i + 1]
        deadline = time.monotonic() + self.reconnect_timeout_s
        backoff = 0.05
        while True:
            try:
                return await self._connect_any(order)
            except RecognizerUnavailable as e:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RecognizerFailed(f"no recognizer server for {self.reconnect_timeout_s:g} s: {e}") from None
            await asyncio.sleep(min(backoff, left))
            backoff = min(2 * backoff, 1.0)

    async def _connect_any(self, order: list[str]) -> WebSocketLink:
        reasons = []
        for url in order:
            try:
                return await self._connect(url)
            except _Refused as e:
                log.info("recognizer %s refused: %s", url, e)
                reasons.append(f"{url}: {e}")
        raise RecognizerUnavailable("no recognizer server could take the stream: " + "; ".join(reasons))

    async def _connect(self, url: str) -> WebSocketLink:
        headers = {"kyutai-api-key": self.api_key} if self.api_key else {}
        try:
            ws = await connect(url, additional_headers=headers, open_timeout=self.open_timeout_s,
                               compression=None, close_timeout=1.0, max_queue=16)
        except InvalidStatus as e:
            code = e.response.status_code
            raise _Refused(_HTTP_REASONS.get(code, f"HTTP {code}")) from None
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as e:
            raise _Refused(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None
        try:
            async with asyncio.timeout(self.open_timeout_s):
                first = parse_server(decode_server(await ws.recv()))
        except ConnectionClosed as e:
            raise _Refused(_describe_close(e)) from None
        except TimeoutError:
            await ws.close()
            raise _Refused(f"no Ready within {self.open_timeout_s:g} s") from None
        except Exception as e:  # undecodable first message
            await ws.close()
            raise _Refused(f"bad first message: {type(e).__name__}: {e}") from None
        if isinstance(first, Error):  # "no free slot: all N slots are busy" / moshi's "no free channels"
            await ws.close()
            raise _Refused(f"server said: {first.message}")
        if not isinstance(first, Ready):
            await ws.close()
            raise _Refused(f"expected Ready, got {type(first).__name__ if first else 'an unknown message'}")
        return WebSocketLink(ws, url, self._send_queue_frames)
