"""A client of Kyutai's ASR WebSocket protocol (moshi-server, `duplex asr-serve`) as a
`StreamingRecognizer`: a conversation can use a recognizer pool on other machines.

- URLs: `ws://HOST:PORT` or `wss://…`, path `/api/asr-streaming` unless one is given; several,
  comma-separated (or a list). Opening tries them in random order and takes the first that
  answers `Ready`; one that is full ("no free slot"/"no free channels", HTTP 503), refuses the
  connection, wants another key or times out is skipped. All fail: `RecognizerUnavailable`
  naming each URL's reason.
- Key: header `kyutai-api-key` (moshi-server's; `None` sends its default `public_token`, `""`
  sends none).
- Pools: a URL's host may be a DNS name that resolves to several addresses (a Kubernetes
  headless Service: one A record per ready replica). Each address is a replica. The name is
  resolved again for every new stream and every reconnect (`resolve(host, port)`, by default
  the loop's getaddrinfo: the event loop never blocks on DNS), so replicas that come and go are
  followed; an IP literal is used as it is. Replicas are tried in random order.
- A connection lost mid-stream is replaced (another replica first, the lost one last, retrying
  for `reconnect_timeout_s`); the stream emits a `Gap` for the audio no recognizer transcribed
  and goes on, the caller's clock unbroken. Gaps are counted (`stats`) and the listener traces
  them. An eviction by the server (idle, too long) is final.
- Backpressure: audio goes through a bounded send queue to one sender task whose `send` waits
  while the socket's write buffer is full, so a server that stops reading (its input buffer
  is full) stops `feed`.

Messages are encoded and decoded by asr.moshi_protocol; the stream logic is asr.moshi_stream's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import random
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import (
    ConnectionClosed,
    InvalidHandshake,
    InvalidStatus,
    InvalidURI,
)

from asr.base import Gap, RecognizerFailed, RecognizerUnavailable
from asr.moshi_protocol import (
    SAMPLE_RATE,
    Audio,
    BadMessage,
    Error,
    Marker,
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


Resolve = Callable[[str, int], Awaitable[Sequence[str]]]  # (host, port) -> addresses


async def getaddrinfo_resolve(host: str, port: int) -> list[str]:
    """The addresses of `host` (every A/AAAA record, in the resolver's order, no duplicates),
    from the loop's getaddrinfo (run in a thread: the loop does not block)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out: list[str] = []
    for *_, sockaddr in infos:
        if sockaddr[0] not in out:
            out.append(sockaddr[0])
    return out


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class Replica:
    """One recognizer server: a URL and, when its host is a name, one address it resolved to
    (the connection goes there; the Host header and TLS keep the name)."""

    url: str
    address: str | None = None

    @property
    def label(self) -> str:
        return self.url if self.address is None else f"{self.url} [{self.address}]"


@dataclass
class PoolStats:
    """What a RemoteRecognizer saw, over its life (read by tests and logs)."""

    opened: int = 0  # streams opened
    refusals: int = 0  # replicas that refused or did not answer (each try)
    reconnects: int = 0  # links replaced mid-stream
    gaps: int = 0  # Gap events emitted
    gap_seconds: float = 0.0  # caller audio no recognizer transcribed


class _Refused(Exception):
    """This URL cannot take a stream now; the message says why."""


class WebSocketLink:
    """A `MoshiLink` over one WebSocket connection that has answered `Ready`."""

    def __init__(self, ws: ClientConnection, url: str, send_queue_frames: int = SEND_QUEUE_FRAMES,
                 replica: Replica | None = None):
        self.ws, self.url = ws, url
        self.replica = replica or Replica(url)
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
        except BadMessage as e:
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
    """Streams on remote Kyutai-protocol servers, with discovery, failover and reconnection.

    `resolve(host, port)`: the addresses of a URL's host name (default: getaddrinfo); a test
    or a service registry can put its own in."""

    sample_rate = SAMPLE_RATE

    def __init__(self, urls: str | Sequence[str], api_key: str | None = None, *, delay_s: float = DEFAULT_DELAY_S,
                 open_timeout_s: float = 5.0, reconnect_timeout_s: float = 10.0, shuffle: bool = True,
                 send_queue_frames: int = SEND_QUEUE_FRAMES, events_max: int = 512,
                 resolve: Resolve | None = None):
        self.urls = split_urls(urls)
        self.api_key = DEFAULT_API_KEY if api_key is None else api_key
        self.delay_s = delay_s
        self.open_timeout_s, self.reconnect_timeout_s = open_timeout_s, reconnect_timeout_s
        self.shuffle = shuffle
        self._send_queue_frames, self._events_max = send_queue_frames, events_max
        self._resolve = resolve or getaddrinfo_resolve
        self.stats = PoolStats()
        self.name = "remote " + ",".join(self.urls)

    async def open_stream(self) -> MoshiStream:
        replicas, reasons = await self.replicas()
        link = await self._connect_any(self._order(replicas), reasons)
        self.stats.opened += 1
        return MoshiStream(link, delay_s=self.delay_s, name=f"remote {link.url}", sample_rate=self.sample_rate,
                           reopen=self._reopen, events_max=self._events_max, on_gap=self._on_gap)

    # ---- discovery -------------------------------------------------------------------------
    async def replicas(self) -> tuple[list[Replica], list[str]]:
        """Every replica the URLs name now (names resolved again), and why a URL gave none."""
        out: list[Replica] = []
        reasons: list[str] = []
        for url in self.urls:
            parts = urlsplit(url)
            host = parts.hostname or ""
            if _is_ip(host):
                out.append(Replica(url))
                continue
            port = parts.port or (443 if parts.scheme == "wss" else 80)
            try:
                async with asyncio.timeout(self.open_timeout_s):
                    addresses = list(await self._resolve(host, port))
            except (OSError, TimeoutError) as e:  # socket.gaierror is an OSError
                reasons.append(f"{url}: cannot resolve {host}: {type(e).__name__}: {e}")
                continue
            if not addresses:
                reasons.append(f"{url}: {host} resolves to no address")
            out += [Replica(url, a) for a in dict.fromkeys(addresses)]
        return out, reasons

    def _order(self, replicas: list[Replica], last: Replica | None = None) -> list[Replica]:
        order = list(replicas)
        if self.shuffle:
            random.shuffle(order)
        if last is not None and last in order:  # the lost one last: it may be coming back
            order.remove(last)
            order.append(last)
        return order

    def _on_gap(self, gap: Gap) -> None:
        self.stats.gaps += 1
        self.stats.gap_seconds += max(0.0, gap.end_s - gap.start_s)

    # ---- connecting ------------------------------------------------------------------------
    async def _reopen(self, lost: MoshiLink) -> WebSocketLink:
        """A new link after `lost`: the names resolved again, the other replicas first, retried
        with backoff until `reconnect_timeout_s` has passed (a restarting server gets the time
        to come back)."""
        deadline = time.monotonic() + self.reconnect_timeout_s
        backoff = 0.05
        last = getattr(lost, "replica", None)
        while True:
            try:
                replicas, reasons = await self.replicas()
                link = await self._connect_any(self._order(replicas, last), reasons)
                self.stats.reconnects += 1
                log.warning("recognizer stream moved from %s to %s", last.label if last else "?", link.replica.label)
                return link
            except RecognizerUnavailable as e:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RecognizerFailed(f"no recognizer server for {self.reconnect_timeout_s:g} s: {e}") from None
            await asyncio.sleep(min(backoff, left))
            backoff = min(2 * backoff, 1.0)

    async def _connect_any(self, order: list[Replica], reasons: list[str] | None = None) -> WebSocketLink:
        reasons = list(reasons or [])
        for replica in order:
            try:
                return await self._connect(replica)
            except _Refused as e:
                self.stats.refusals += 1
                log.info("recognizer %s refused: %s", replica.label, e)
                reasons.append(f"{replica.label}: {e}")
        raise RecognizerUnavailable("no recognizer server could take the stream: " + "; ".join(reasons))

    async def _connect(self, replica: Replica | str) -> WebSocketLink:
        if isinstance(replica, str):
            replica = Replica(replica)
        url = replica.url
        headers = {"kyutai-api-key": self.api_key} if self.api_key else {}
        target = {} if replica.address is None else {"host": replica.address}
        try:
            ws = await connect(url, additional_headers=headers, open_timeout=self.open_timeout_s,
                               compression=None, close_timeout=1.0, max_queue=16, **target)
        except InvalidStatus as e:
            code = e.response.status_code
            reason = _HTTP_REASONS.get(code, f"HTTP {code}")
            body = e.response.body.decode(errors="replace").strip() if e.response.body else ""
            raise _Refused(f"{reason}: {body[:120]}" if body and code == 503 else reason) from None
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
        return WebSocketLink(ws, replica.label, self._send_queue_frames, replica)
