"""The bot's voice as an outgoing WebRTC audio track.

aiortc's sender asks `recv()` for the next frame and sends it at once, so this track is the
last place reply audio waits on the server: a bounded `Playback` (at most `max_s`, the
session sends ~0.4 s ahead) paced here at real time, 20 ms frames at 48 kHz, silence when it is
empty. `clear()` empties it, so after a barge-in nothing more of the reply leaves the server.
Each frame handed to the encoder reports which reply pieces start or end in it (`on_handoff`):
the moment the audio leaves for RTP, not the moment the far end plays it.

The track encodes its frames itself (aiortc's Opus encoder, on a small thread pool of ours) and
hands the sender Opus packets, which it sends as they are: left to aiortc, every frame of every
conversation is encoded on asyncio's default executor, shared with every `to_thread` of the
process, where one slow call delays every conversation's next frame.
"""
from __future__ import annotations

import asyncio
import fractions
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import av
import numpy as np
from aiortc.codecs.opus import OpusEncoder
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from transport.base import Played
from transport.playback import Playback

RATE = 48000
FRAME_S = 0.02
FRAME = int(RATE * FRAME_S)
MAX_CATCH_UP_S = 0.2
TIME_BASE = fractions.Fraction(1, RATE)
# one encode (~0.3 ms) per track in flight at a time, so a thread or two serve many conversations
_ENCODER_POOL = ThreadPoolExecutor(min(2, os.cpu_count() or 1), thread_name_prefix="duplex-opus")


class ReplyAudioTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(self, on_handoff: Callable[[list[Played], int], None] | None = None, max_s: float = 10.0):
        super().__init__()
        self.playback = Playback(RATE, max_s=max_s, frame_s=FRAME_S)
        self._on_handoff = on_handoff
        self._pts = 0  # samples handed out so far: the frame's RTP timestamp minus a random origin
        self._t0: float | None = None
        self.frames_sent = self.audio_frames_sent = 0
        self.late_s = 0.0  # the most a frame was late (a stalled loop)
        self._encoder = OpusEncoder()

    def push(self, chunk_id: int, pcm16: np.ndarray) -> None:
        """Queue a reply piece (int16 at 48 kHz); OverflowError beyond `max_s`."""
        self.playback.push(chunk_id, pcm16)

    def clear(self) -> int:
        """Drop everything not yet handed to the encoder; the number of samples dropped."""
        dropped = self.playback.queued
        self.playback.clear()
        return dropped

    async def recv(self) -> av.Packet:
        """The next 20 ms, Opus-encoded, at its time."""
        while True:
            frame = await self._next_frame()
            payloads, _ = await asyncio.get_running_loop().run_in_executor(_ENCODER_POOL, self._encoder.encode, frame)
            if payloads:  # the encoder gives one packet per 20 ms frame; none would mean it buffers
                packet = av.Packet(payloads[0])
                packet.pts, packet.time_base = frame.pts, TIME_BASE
                return packet

    async def _next_frame(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.perf_counter()
        if self._t0 is None:
            self._t0 = now
        else:
            # real time: frame k leaves at t0 + k * 20 ms. After a short stall of the loop (a
            # busy machine) the late frames go at once, a burst that the peer's jitter buffer
            # takes; after a longer one the time is given up, and the reply plays later than
            # the session's clock says (the handoff marks say when).
            wait = self._t0 + self._pts / RATE - now
            if wait > 0:
                await asyncio.sleep(wait)
            else:
                self.late_s = max(self.late_s, -wait)
                if -wait > MAX_CATCH_UP_S:
                    self._t0 = now - self._pts / RATE
        pcm, events = self.playback.tick(time.perf_counter())
        if pcm is None:
            pcm = np.zeros(FRAME, np.int16)
        else:
            self.audio_frames_sent += 1
        frame = av.AudioFrame(format="s16", layout="mono", samples=FRAME)
        frame.planes[0].update(np.ascontiguousarray(pcm, dtype=np.int16).tobytes())
        frame.pts, frame.sample_rate = self._pts, RATE
        frame.time_base = TIME_BASE
        if events and self._on_handoff is not None:
            self._on_handoff(events, self._pts)
        self._pts += FRAME
        self.frames_sent += 1
        return frame
