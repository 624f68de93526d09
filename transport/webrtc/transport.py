"""One WebRTC conversation as a `Transport`: the mic as the peer's incoming Opus track, the bot
as our outgoing track (transport/webrtc/track.py), and the page's JSON events (the /ws page's
protocol, transport/web/protocol.py) on an RTCDataChannel.

Played marks: a peer that says `{"type": "hello", "played_marks": "page"}` reports them itself
("played" messages, from what its <audio> element plays) and they become `Played` events as on
the WebSocket page. For any other peer they are the moments each piece's first and last frame
is handed to the Opus encoder (RTP): the far end hears them later by its jitter buffer. Either
way every piece handed to RTP is announced on the channel (`{"type": "audio", "id", "event",
"rtp", "server_ms"}`, rtp: the frame's timestamp from the track's start).

Bounded: mic frames (oldest dropped), control events and events waiting for the channel to open
have caps; an event for a channel whose peer stopped reading (`bufferedAmount` over the cap) is
dropped and counted. A peer that sends nothing (no mic frame, no message) for `peer_timeout_s`
is taken as gone: aioice's consent check alone would take 30 s.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque

import numpy as np
from aiortc import RTCDataChannel, RTCPeerConnection
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from transport.audio import INPUT_RATE, Int16RateAdapter, StreamResampler, int16_to_float
from transport.base import (
    AudioIn,
    AudioOut,
    ClientEvent,
    InputEvent,
    Played,
    ProtocolError,
)
from transport.events import SessionEvent
from transport.web.protocol import (
    ClientControl,
    decode_client,
    encode_event,
    error_event,
)
from transport.webrtc.track import RATE, ReplyAudioTrack
from transport.wire import BadInput

log = logging.getLogger("duplex.webrtc")


def server_ms() -> float:
    return time.perf_counter() * 1000.0


class WebRTCTransport:
    reports_playout = True
    kind = "webrtc"  # names the conversation in logs, traces and metrics

    def __init__(self, pc: RTCPeerConnection, *, max_mic_frames: int = 250, max_control: int = 256,
                 max_pending: int = 64, max_buffered_bytes: int = 1 << 18, peer_timeout_s: float = 5.0,
                 connect_timeout_s: float = 20.0, max_playback_s: float = 10.0):
        self.pc = pc
        self.track = ReplyAudioTrack(self._handed_off, max_s=max_playback_s)
        self.input_sample_rate, self.output_sample_rate = INPUT_RATE, RATE
        self._to_track_rate = Int16RateAdapter(RATE)
        self._mic: deque[AudioIn] = deque(maxlen=max_mic_frames)
        self._control: deque[InputEvent] = deque()
        self._max_control = max_control
        self._pending: deque[str] = deque(maxlen=max_pending)  # for the channel, until it opens
        self._max_buffered = max_buffered_bytes
        self._channel: RTCDataChannel | None = None
        self._mic_track: MediaStreamTrack | None = None
        self._wake = asyncio.Event()
        self._ended: str | None = None
        self._closed = False
        self._page_marks = False  # the peer reports what it played
        self._tasks: set[asyncio.Task] = set()
        self._peer_timeout_s, self._connect_timeout_s = peer_timeout_s, connect_timeout_s
        self._last_heard = time.monotonic()
        self.bad_input = BadInput(log, "webrtc peer")
        self.dropped_events = self.dropped_mic_frames = self.dropped_audio = 0
        self.cleared_samples = 0

        pc.on("track", self._on_track)
        pc.on("datachannel", self.attach_channel)
        pc.on("connectionstatechange", self._on_state)
        self._spawn(self._watchdog(), "webrtc-watchdog")

    # ---- wiring -----------------------------------------------------------------------------------
    def _spawn(self, coro, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind != "audio":
            return
        if self._mic_track is not None:  # one microphone: a second would mix into its stream
            log.warning("webrtc peer sent a second audio track; ignored")
            return
        self._mic_track = track
        self._spawn(self._read_mic(track), "webrtc-mic")

    def attach_channel(self, channel: RTCDataChannel) -> None:
        if self._channel is not None:
            log.warning("webrtc peer opened a second data channel %r; ignored", channel.label)
            return
        self._channel = channel
        channel.on("message", self._on_message)
        channel.on("open", self._flush_pending)
        channel.on("close", lambda: self._end("the data channel closed"))
        if channel.readyState == "open":
            self._flush_pending()

    def _on_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self._end(f"the peer connection is {self.pc.connectionState}")

    def _end(self, why: str) -> None:
        if self._ended is None:
            self._ended = why
            log.info("webrtc conversation ends: %s", why)
        self._wake.set()

    # ---- input ------------------------------------------------------------------------------------
    async def _read_mic(self, track: MediaStreamTrack) -> None:
        resampler: StreamResampler | None = None
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                self._end("the microphone track ended")
                return
            self._last_heard = time.monotonic()
            pcm = frame.to_ndarray()
            channels = len(frame.layout.channels)
            # packed s16 (what aiortc's Opus decoder gives): one row, channels interleaved
            pcm = pcm.reshape(-1, channels) if not frame.format.is_planar else pcm.T
            mono = int16_to_float(pcm.astype(np.int32).mean(axis=1).astype(np.int16))
            if resampler is None or resampler.in_rate != frame.sample_rate:
                resampler = StreamResampler(frame.sample_rate, INPUT_RATE)
            if len(self._mic) == self._mic.maxlen:
                self.dropped_mic_frames += 1  # the session fell behind: the oldest frame goes
            self._mic.append(AudioIn(resampler(mono), INPUT_RATE))
            self._wake.set()

    def _on_message(self, message: str | bytes) -> None:
        self._last_heard = time.monotonic()
        try:
            if not isinstance(message, str):
                raise ProtocolError("bad_message", "audio goes on the media track; the channel takes JSON text")
            decoded = decode_client(message)
            if not isinstance(decoded, ClientControl):
                raise ProtocolError("bad_message", "unexpected message")
        except ProtocolError as exc:
            self.bad_input(exc, None)
            self._send(error_event(exc.code, str(exc)))
            return
        kind, data = decoded.type, decoded.data
        if kind == "hello":
            # the mic rate is the track's; the hello only says who reports played marks
            with contextlib.suppress(ValueError):
                self._page_marks = json.loads(message).get("played_marks") == "page"
            self._send(encode_event({"type": "ready", "transport": "webrtc", "sample_rate": RATE,
                                     "input_sample_rate": INPUT_RATE, "server_ms": server_ms(),
                                     "played_marks": "page" if self._page_marks else "rtp"}))
        elif kind == "ping":
            self._send(encode_event({"type": "pong", "t": data["t"], "server_ms": server_ms()}))
        elif kind == "played":
            if self._page_marks:
                est = data["server_ms"]
                self._control_event(Played(data["id"], data["event"], est / 1000.0 if est is not None else None))
        else:
            self._control_event(ClientEvent(kind, data))

    def _control_event(self, event: InputEvent) -> None:
        if len(self._control) >= self._max_control:
            self.dropped_events += 1  # a peer flooding us; the session reads far faster than this
            return
        self._control.append(event)
        self._wake.set()

    def _handed_off(self, events: list[Played], pts: int) -> None:
        for ev in events:
            self._send(encode_event({"type": "audio", "id": ev.chunk_id, "event": ev.event, "rtp": pts,
                                     "server_ms": ev.server_time * 1000.0}))
            if not self._page_marks:
                self._control_event(ev)

    async def receive(self) -> InputEvent | None:
        while not (self._control or self._mic):
            if self._ended is not None:
                return None
            self._wake.clear()
            await self._wake.wait()
        return self._control.popleft() if self._control else self._mic.popleft()

    async def _watchdog(self) -> None:
        started = time.monotonic()
        while self._ended is None:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            if self.pc.connectionState != "connected":
                if now - started > self._connect_timeout_s:
                    self._end(f"not connected after {self._connect_timeout_s:.0f} s")
                continue
            if now - self._last_heard > self._peer_timeout_s:
                self._end(f"nothing from the peer for {self._peer_timeout_s:.0f} s")

    # ---- output -----------------------------------------------------------------------------------
    def _send(self, text: str) -> None:
        ch = self._channel
        if ch is None or ch.readyState == "connecting":
            self._pending.append(text)  # bounded: the oldest goes
            return
        if ch.readyState != "open":
            return
        if ch.bufferedAmount > self._max_buffered:
            self.dropped_events += 1  # the peer stopped reading: its events go, not our memory
            if self.dropped_events in (1, 100) or self.dropped_events % 10000 == 0:
                log.warning("webrtc peer is not reading its data channel: %d events dropped", self.dropped_events)
            return
        ch.send(text)

    def _flush_pending(self) -> None:
        while self._pending and self._channel is not None and self._channel.readyState == "open":
            self._send(self._pending.popleft())

    async def send_audio(self, chunk: AudioOut) -> None:
        try:
            self.track.push(chunk.chunk_id, self._to_track_rate(chunk.pcm, chunk.sample_rate))
        except OverflowError as exc:
            self.dropped_audio += 1
            log.warning("webrtc: reply audio dropped: %s", exc)

    async def clear(self) -> None:
        self.cleared_samples += self.track.clear()
        self._send(encode_event({"type": "clear"}))

    async def send_event(self, event: SessionEvent) -> None:
        self._send(encode_event(event.to_wire()))

    def abnormal_end(self) -> str | None:
        """Why the peer was lost (not a clean close of the connection or the channel), or None."""
        return self._ended if self._ended and "closed" not in self._ended else None

    async def close(self) -> None:
        """Release the connection, its tracks and our tasks. Shielded: a conversation cancelled
        mid-close (a server shutting down) still closes it, and aiortc's own close on the peer's
        DTLS close shares a future that a cancelled second waiter would cancel under it."""
        if self._closed:
            return
        self._closed = True
        await asyncio.shield(self._close())

    async def _close(self) -> None:
        self._end("closed by the server")
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.track.stop()
        await self.pc.close()
