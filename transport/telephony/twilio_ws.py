"""asyncio shell for Twilio Media Streams: one WebSocket from Twilio as a `Transport`.

The wire format and the mark bookkeeping live in `transport.telephony.twilio` (Sans-I/O); this
only moves messages. Twilio reads no error messages, so a bad one is logged, counted and
skipped: the call goes on.
"""
from __future__ import annotations

import logging
import time

from websockets.exceptions import ConnectionClosed

from transport.audio import Int16RateAdapter
from transport.base import AudioOut, InputEvent, ProtocolError
from transport.telephony.twilio import RATE, CallEnded, TwilioCall

log = logging.getLogger("duplex.twilio")


class TwilioTransport:
    reports_playout = True  # from the marks Twilio echoes back

    def __init__(self, ws) -> None:
        self.ws = ws
        self.call = TwilioCall()
        self.output_sample_rate = RATE
        self._to_8k = Int16RateAdapter(RATE)
        self.errors = 0

    async def _send(self, messages: list[str]) -> None:
        try:
            for m in messages:
                await self.ws.send(m)
        except ConnectionClosed:
            pass

    async def receive(self) -> InputEvent | None:
        while True:
            try:
                message = await self.ws.recv()
            except ConnectionClosed:
                return None
            try:
                event = self.call.receive(message, time.perf_counter())
            except CallEnded:
                return None
            except ProtocolError as exc:
                self.errors += 1
                log.warning("twilio stream %s: %s (%s); message skipped", self.call.stream_sid, exc, exc.code)
                continue
            if event is not None:
                return event

    async def send_audio(self, chunk: AudioOut) -> None:
        await self._send(self.call.audio(chunk.chunk_id, self._to_8k(chunk.pcm, chunk.sample_rate)))

    async def clear(self) -> None:
        await self._send(self.call.clear())

    async def send_event(self, event: dict) -> None:
        """A phone has no screen: UI events go nowhere."""
