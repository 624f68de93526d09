"""asyncio shell for Asterisk AudioSocket: a TCP server, each call a `Transport`.

A reader task turns frames into input events and a pacer task sends reply audio at real time,
20 ms a frame; both feed one bounded queue that `receive` reads, so a session that stops reading
stops the socket being read (TCP pushes back on Asterisk). The conversation handler is injected:
this module knows nothing of the agent.

AudioSocket carries no credentials, so the only guard is where a call comes from: a source
allowlist of networks (default: loopback, an Asterisk on the same machine), checked before
anything is read or admitted.
"""
from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from transport.admission import Admission
from transport.audio import Int16RateAdapter
from transport.base import AudioOut, InputEvent, ProtocolError
from transport.events import SessionEvent
from transport.limits import LOOPBACK, within
from transport.telephony.audiosocket import (
    FRAME_S, HANGUP, AudioSocketCall, CallEnded, FrameParser, encode_audio, encode_frame)
from transport.playback import Playback
from transport.wire import BadInput

log = logging.getLogger("duplex.audiosocket")
READ_BYTES = 4096
CLOSE_TIMEOUT_S = 2.0  # the hang-up frame's last chance to go out
_END = object()
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def networks(cidrs: Sequence[str]) -> list[Network]:
    """`--audiosocket-allow` values as networks; ValueError names a bad one."""
    out = []
    for cidr in cidrs:
        try:
            out.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError:
            raise ValueError(f"--audiosocket-allow needs an address or CIDR network, got {cidr!r}") from None
    return out


def source_allowed(peer: str | None, allowed: Sequence[Network]) -> bool:
    """Whether a connection from address `peer` may place a call (IPv4-mapped IPv6 as IPv4)."""
    return within(peer, allowed)


class AudioSocketTransport:
    reports_playout = True  # we pace the audio ourselves, so we know what went out when
    kind = "sip"  # names the conversation in logs, traces and metrics

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_events: int = 256):
        self.reader, self.writer = reader, writer
        self.call = AudioSocketCall()
        self._events: asyncio.Queue = asyncio.Queue(maxsize=max_events)
        self._playback: Playback | None = None
        self._to_rate: Int16RateAdapter | None = None
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.bad_input = BadInput(log, "audiosocket call")
        self.closed = False

    def _start(self) -> None:
        if not self._tasks:
            self._tasks = [asyncio.create_task(self._read(), name="audiosocket-read"),
                           asyncio.create_task(self._pace(), name="audiosocket-pace")]

    async def _read(self) -> None:
        parser = FrameParser()
        try:
            while data := await self.reader.read(READ_BYTES):
                for frame in parser.feed(data):
                    try:
                        event = self.call.receive(frame)
                    except ProtocolError as exc:
                        self.bad_input(exc, self.call.call_id)
                        continue
                    if event is not None:
                        await self._events.put(event)
        except CallEnded:
            pass
        except (ConnectionError, OSError) as exc:
            log.info("audiosocket call %s: connection lost: %s", self.call.call_id, exc)
        finally:
            self.closed = True
            self._wake.set()
            await self._events.put(_END)

    async def _pace(self) -> None:
        due = time.perf_counter()
        while not self.closed:
            playback = self._playback
            frame, events = playback.tick(time.perf_counter()) if playback else (None, [])
            if frame is not None:
                try:
                    self.writer.write(encode_audio(frame, playback.rate))
                    await self.writer.drain()
                except (ConnectionError, OSError):
                    return
            for ev in events:
                await self._events.put(ev)
            if frame is None:  # idle (`tick` gives None only once nothing is queued): the next
                self._wake.clear()  # piece goes out as soon as it comes
                await self._wake.wait()
                due = time.perf_counter()
                continue
            due = max(due + FRAME_S, time.perf_counter() - 0.1)  # late by >100 ms: no burst to catch up
            await asyncio.sleep(max(0.0, due - time.perf_counter()))

    async def receive(self) -> InputEvent | None:
        self._start()
        event = await self._events.get()
        return None if event is _END else event

    async def send_audio(self, chunk: AudioOut) -> None:
        rate = self.call.rate
        if self._playback is None or self._playback.rate != rate:
            self._playback, self._to_rate = Playback(rate), Int16RateAdapter(rate)
        try:
            self._playback.push(chunk.chunk_id, self._to_rate(chunk.pcm, chunk.sample_rate))
        except OverflowError as exc:
            log.warning("audiosocket call %s: %s; piece %d dropped", self.call.call_id, exc, chunk.chunk_id)
        self._wake.set()

    async def clear(self) -> None:
        if self._playback is not None:
            self._playback.clear()

    async def send_event(self, event: SessionEvent) -> None:
        """A phone has no screen: UI events go nowhere."""

    async def close(self) -> None:
        self.closed = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        try:  # a peer that never reads would hold the drain for ever
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                if not self.writer.is_closing():
                    self.writer.write(encode_frame(HANGUP))
                    await self.writer.drain()
            self.writer.close()
        except (ConnectionError, OSError, TimeoutError):
            self.writer.transport.abort()


Handler = Callable[[AudioSocketTransport], Awaitable[None]]


async def run_audiosocket_server(handler: Handler, host: str, port: int, ready: asyncio.Event | None = None,
                                 admission: Admission | None = None, busy: Handler | None = None,
                                 allow: Sequence[str] = LOOPBACK) -> None:
    """Serve AudioSocket calls until cancelled; `handler(transport)` runs one conversation each.
    Calls that `admission` refuses (default: beyond 16 at once) hear `busy(transport)` (when
    given) and are hung up. `allow`: the networks calls may come from (default loopback); a
    connection from anywhere else is closed at once, unread."""
    admission = admission or Admission()
    allowed = networks(allow)

    async def call(transport: AudioSocketTransport) -> None:
        if (reason := admission.enter()) is not None:
            log.warning("audiosocket: hanging up: %s", reason)
            if busy is not None:
                await busy(transport)
            return
        try:
            await handler(transport)
        finally:
            admission.leave()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = (writer.get_extra_info("peername") or (None,))[0]
        if not source_allowed(peer, allowed):
            log.warning("audiosocket: refused a connection from %s (not in --audiosocket-allow)", peer)
            writer.transport.abort()
            return
        transport = AudioSocketTransport(reader, writer)
        try:
            await call(transport)
        except asyncio.CancelledError:
            pass  # the server stops; asyncio would log a cancelled connection callback as an error
        except Exception:
            log.exception("audiosocket session failed")
        finally:
            await transport.close()

    server = await asyncio.start_server(on_connect, host, port)
    async with server:
        bound = server.sockets[0].getsockname()
        print(f"duplex: Asterisk AudioSocket on {host}:{bound[1]} (dialplan: AudioSocket(${{UUID}},HOST:{bound[1]}))",
              flush=True)
        if ready is not None:
            ready.set()
        await server.serve_forever()
